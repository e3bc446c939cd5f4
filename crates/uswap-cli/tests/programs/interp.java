// A JVM heap under uswap run: four threads each build a HashMap of arrays
// (a G1 heap that grows, collects and commits memory anew), read some back
// at random while they go, then check every array and print one sum. Run
// with the source launcher: java interp.java [N] (N entries per thread,
// 30000 if not given)
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class Interp {
    public static void main(String[] args) throws Exception {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 30000;
        int threads = 4;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        List<Future<Long>> results = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int seed = t;
            results.add(pool.submit(() -> {
                Random r = new Random(seed);
                HashMap<Integer, long[]> m = new HashMap<>();
                long sum = 0;
                for (int i = 0; i < n; i++) {
                    int k = r.nextInt(n / 2);
                    long[] v = new long[64 + r.nextInt(256)];
                    for (int j = 0; j < v.length; j++) {
                        v[j] = (long) k * 31 + j;
                    }
                    m.put(k, v);
                    if (i % 7 == 0) {
                        long[] w = m.get(r.nextInt(n / 2));
                        if (w != null) {
                            for (long x : w) {
                                sum += x;
                            }
                        }
                    }
                }
                for (Map.Entry<Integer, long[]> e : m.entrySet()) {
                    long[] v = e.getValue();
                    for (int j = 0; j < v.length; j++) {
                        if (v[j] != (long) e.getKey() * 31 + j) {
                            throw new IllegalStateException("array of key " + e.getKey() + " changed");
                        }
                        sum += v[j];
                    }
                }
                return sum ^ m.size();
            }));
        }
        long total = 0;
        for (Future<Long> f : results) {
            total += f.get();
        }
        pool.shutdown();
        System.out.println("sum " + total);
    }
}
