// A node program under pressure: 40 MiB of random numbers (they do not
// compress), a Map of 200,000 objects, and a worker thread reading a
// SharedArrayBuffer the main thread filled. Prints the same line every run.
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
if (!isMainThread) {
  const a = new Int32Array(workerData);
  let s = 0;
  for (let r = 0; r < 3; r++) for (let i = 0; i < a.length; i += 7) s = (s + a[i] * (r + 1)) | 0;
  parentPort.postMessage(s);
  return;
}
const noise = new Uint32Array(10 << 20);
let xs = 2463534242;
for (let i = 0; i < noise.length; i++) {
  xs ^= xs << 13; xs ^= xs >>> 17; xs ^= xs << 5; xs >>>= 0;
  noise[i] = xs;
}
const m = new Map();
for (let i = 0; i < 200000; i++) {
  m.set('key' + i, { id: i, name: 'item-' + (i * 7919 % 100003), tags: [i % 13, i % 17] });
}
const shared = new Int32Array(new SharedArrayBuffer(8 << 20));
for (let i = 0; i < shared.length; i++) shared[i] = i * 2654435761 | 0;
const w = new Worker(__filename, { workerData: shared.buffer });
let sum = 0;
for (let r = 0; r < 3; r++) for (let i = 0; i < noise.length; i += 97) sum = (sum + noise[i]) % 1000000007;
let names = 0;
for (let i = 0; i < 200000; i += 3) names += m.get('key' + i).name.length;
w.on('message', (s) => console.log('noise', sum, 'map', names, 'worker', s));
