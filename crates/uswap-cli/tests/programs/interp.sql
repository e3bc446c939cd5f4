-- An in-memory database larger than its limit: rows, an index, a join and
-- aggregates. Prints the same lines every run.
PRAGMA cache_size = -100000;
CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, v INTEGER, pad TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)
INSERT INTO t SELECT i, printf('key%08d', (i * 7919) % 200003), (i * 31) % 1000, hex(randomblob(0) || zeroblob(16)) || printf('%d', i * i) FROM n;
CREATE INDEX t_k ON t (k);
CREATE TABLE u AS SELECT v, count(*) AS c, sum(id) AS s FROM t GROUP BY v;
SELECT count(*), sum(v), sum(length(pad)) FROM t;
SELECT k, v FROM t WHERE k BETWEEN 'key00100000' AND 'key00100100' ORDER BY k LIMIT 5;
SELECT sum(t.id % 97 * u.c) FROM t JOIN u ON t.v = u.v WHERE t.id % 5 = 0;
UPDATE t SET v = v + 1 WHERE id % 3 = 0;
SELECT v, count(*) FROM t GROUP BY v ORDER BY count(*) DESC, v LIMIT 3;
