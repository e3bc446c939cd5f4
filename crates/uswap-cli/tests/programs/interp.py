# Interpreter memory under pressure: dicts, lists, strings and bytes, then
# forked workers (multiprocessing) that read the parent's memory and send
# results back. Prints the same lines every run.
import hashlib
import multiprocessing as mp

table = {f"key{i}": (i, str(i * 7919 % 100003), [i % 13, i % 17]) for i in range(60_000)}
blob = [bytes((i * 31 + j) % 251 for j in range(64)) * 16 for i in range(8_000)]
numbers = list(range(600_000))


def work(part):
    h = hashlib.sha256()
    s = 0
    for i in range(part, 60_000, 8):
        n, name, tags = table[f"key{i}"]
        s += n + len(name) + sum(tags)
    for b in blob[part::8]:
        h.update(b)
    return part, s, sum(numbers[part::8]), h.hexdigest()[:16]


if __name__ == "__main__":
    mp.set_start_method("fork")
    with mp.Pool(4) as pool:
        for part, s, n, d in pool.map(work, range(8)):
            print(part, s, n, d)
    del table[f"key{7}"]
    table["extra"] = (0, "x", [])
    print(len(table), sum(len(b) for b in blob), sum(numbers[::1000]))
