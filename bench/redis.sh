#!/bin/bash
# redis-server under a limit: loads 150,000 keys (about 100 MB resident
# alone), forks a background save, deletes a third and grows a seventh, and
# prints the dataset's digest after each step (the same with and without
# uswap) and the elapsed time.
#
#   bench/redis.sh PORT [WRAPPER...]
#   bench/redis.sh 7100                                              # alone
#   bench/redis.sh 7200 target/release/uswap run --memory-high 32M --folio-size 4k --
#
# Needs redis-server and redis-cli (.ci/run installs redis-server).
set -u
port=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import sys
def cmd(*a):
    s = f"*{len(a)}\r\n"
    for x in a:
        x = str(x)
        s += f"${len(x.encode())}\r\n{x}\r\n"
    return s
with open(sys.argv[1] + "/load.resp", "w") as f:
    for i in range(150000):
        v = (f"value-{i}-" + "".join(chr(97 + (i * j * 7 + j) % 26) for j in range(40))) * 7
        f.write(cmd("SET", f"key:{i}", v))
        if i % 10 == 0:
            f.write(cmd("HSET", f"h:{i // 10}", "a", i, "b", v[:50]))
        if i % 5 == 0:
            f.write(cmd("RPUSH", f"l:{i % 1000}", v[:30]))
with open(sys.argv[1] + "/churn.resp", "w") as f:
    for i in range(0, 150000, 3):
        f.write(cmd("DEL", f"key:{i}"))
    for i in range(0, 150000, 7):
        f.write(cmd("APPEND", f"key:{i}", "tail" * 20))
PY
cli() { redis-cli -p "$port" "$@"; }
start=$(date +%s.%N)
"$@" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" --enable-debug-command yes --logfile "$dir/redis.log" &
pid=$!
for _ in $(seq 200); do cli ping >/dev/null 2>&1 && break; sleep 0.05; done
cli --pipe <"$dir/load.resp" | tail -1
echo "loaded: digest $(cli debug digest) keys $(cli dbsize)"
cli bgsave >/dev/null
while cli info persistence | grep -q "^rdb_bgsave_in_progress:1"; do sleep 0.05; done
echo "saved: $(cli info persistence | grep -o 'rdb_last_bgsave_status:[a-z]*')"
cli --pipe <"$dir/churn.resp" | tail -1
echo "churned: digest $(cli debug digest) keys $(cli dbsize)"
cli shutdown nosave >/dev/null
wait $pid
rc=$?
end=$(date +%s.%N)
echo "exit $rc, $(echo "$end - $start" | bc) s"
