#!/usr/bin/env python3
"""Who held the CPU while a fault server or the program waited to run.

    perf sched record -o sched.data -- CMD...
    perf sched timehist -i sched.data > timehist.txt
    python3 bench/sched-waits.py timehist.txt [--min-ms 0.5] [--waiters REGEX]

For every switch-in of a waiting thread (by default the runtime's event
thread and fillers, and `touch`) whose scheduling delay (runnable, not
running) was at least --min-ms, it adds up which threads ran on that CPU
during the delay. Prints how many such waits there were, by waiting thread,
and the milliseconds each other thread held the CPU through them, most
first. Thread ids are dropped from names, so each thread kind sums up.
"""
import argparse
import bisect
import collections
import re

ROW = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def kind(task):
    return re.sub(r"\[.*", "", task)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("timehist")
    ap.add_argument("--min-ms", type=float, default=0.5)
    ap.add_argument("--waiters", default=r"uswap-(fill|uffd)|touch")
    args = ap.parse_args()
    waiter = re.compile(args.waiters)
    # (time s, cpu, task, wait ms, delay ms, run ms), one per switch-out.
    rows = []
    with open(args.timehist) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                rows.append((float(m[1]), int(m[2]), m[3].strip(),
                             float(m[4]), float(m[5]), float(m[6])))
    # Each CPU's runs in time order (they do not overlap), with their end
    # times for bisection.
    by_cpu = collections.defaultdict(list)
    for r in sorted(rows):
        by_cpu[r[1]].append(r)
    ends = {cpu: [r[0] for r in runs] for cpu, runs in by_cpu.items()}
    waits = collections.Counter()
    held = collections.Counter()
    for t, cpu, task, _, delay, run in rows:
        if delay < args.min_ms or not waiter.match(task):
            continue
        waits[kind(task)] += 1
        # The delay ended when this run began.
        begin = t - run / 1e3 - delay / 1e3
        end = t - run / 1e3
        runs = by_cpu[cpu]
        for k in range(bisect.bisect_right(ends[cpu], begin), len(runs)):
            t2, _, task2, _, _, run2 = runs[k]
            start2 = t2 - run2 / 1e3
            if start2 >= end:
                break
            held[kind(task2)] += min(t2, end) - max(start2, begin)
    print(f"waits of {args.min_ms} ms or more: {sum(waits.values())}",
          dict(waits.most_common()))
    print("CPU held through them, ms:",
          {k: round(v * 1e3, 1) for k, v in held.most_common(10)})


if __name__ == "__main__":
    main()
