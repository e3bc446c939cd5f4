/* liblzo2's LZO1X-1 on the data our LZO codec is measured on, for a side
 * by side with `uswap bench codecs --codecs lzo,lzo-rle --folios 4k,64k`:
 * the corpus pages in 64 KiB folios, and 64 KiB folios of usemem's data
 * (64-bit words holding their own index). For each: compression with
 * lzo1x_1_compress and decompression with lzo1x_decompress_safe of the
 * same streams (liblzo2's), p50 per folio and MB/s over the whole pass
 * (the first of three passes is a warm-up and is not timed).
 *
 *   apt-get install liblzo2-dev
 *   cc -O2 bench/probes/liblzo2.c -o /tmp/liblzo2 -llzo2
 *   /tmp/liblzo2 corpus/NAME.pages ...   (every corpus file)
 *
 * liblzo2 writes plain LZO1X (no zero runs), so compare it with our `lzo`
 * rows; `lzo-rle` differs only on runs of zeros. The corpus files are read
 * end to end and cut into 64 KiB folios, so a few folios span two files.
 */
#include <lzo/lzo1x.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FOLIO 65536

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Compresses and decompresses every folio of `data` three times; reports
 * the last two passes. */
static void measure(const char *what, const unsigned char *data, size_t folios)
{
	static unsigned char wrk[LZO1X_1_MEM_COMPRESS];
	unsigned char *streams = malloc(folios * (FOLIO + FOLIO / 16 + 64 + 3));
	lzo_uint *lens = malloc(folios * sizeof(lzo_uint));
	double *clat = malloc(2 * folios * sizeof(double));
	double *dlat = malloc(2 * folios * sizeof(double));
	unsigned char *back = malloc(FOLIO);
	size_t stride = FOLIO + FOLIO / 16 + 64 + 3, in = 0, out = 0, n = 0;
	double ctime = 0, dtime = 0;
	if (!streams || !lens || !clat || !dlat || !back) {
		fprintf(stderr, "liblzo2: out of memory\n");
		exit(1);
	}
	for (int pass = 0; pass < 3; pass++) {
		for (size_t f = 0; f < folios; f++) {
			double t = now();
			if (lzo1x_1_compress(data + f * FOLIO, FOLIO, streams + f * stride, &lens[f], wrk) != LZO_E_OK) {
				fprintf(stderr, "liblzo2: compression failed\n");
				exit(1);
			}
			double c = now() - t;
			lzo_uint got = FOLIO;
			t = now();
			int e = lzo1x_decompress_safe(streams + f * stride, lens[f], back, &got, NULL);
			double d = now() - t;
			if (e != LZO_E_OK || got != FOLIO || memcmp(back, data + f * FOLIO, FOLIO)) {
				fprintf(stderr, "liblzo2: a stream did not decode back\n");
				exit(1);
			}
			if (pass > 0) {
				clat[n] = c;
				dlat[n] = d;
				n++;
				ctime += c;
				dtime += d;
				in += FOLIO;
				out += lens[f];
			}
		}
	}
	qsort(clat, n, sizeof(double), cmp_double);
	qsort(dlat, n, sizeof(double), cmp_double);
	printf("liblzo2 lzo1x-1 %-7s 64K  ratio %.2f  c p50 %6.1f us  c MB/s %4.0f  d p50 %6.1f us  d MB/s %4.0f\n",
	       what, (double)in / out, clat[n / 2] * 1e6, in / ctime / 1e6, dlat[n / 2] * 1e6, in / dtime / 1e6);
	free(streams);
	free(lens);
	free(clat);
	free(dlat);
	free(back);
}

int main(int argc, char **argv)
{
	if (lzo_init() != LZO_E_OK) {
		fprintf(stderr, "liblzo2: lzo_init failed\n");
		return 1;
	}
	unsigned char *corpus = NULL;
	size_t size = 0;
	for (int a = 1; a < argc; a++) {
		FILE *f = fopen(argv[a], "rb");
		if (!f) {
			perror(argv[a]);
			return 2;
		}
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		fseek(f, 0, SEEK_SET);
		corpus = realloc(corpus, size + len);
		if (!corpus || fread(corpus + size, 1, len, f) != (size_t)len) {
			fprintf(stderr, "liblzo2: reading %s failed\n", argv[a]);
			return 1;
		}
		size += len;
		fclose(f);
	}
	if (size >= FOLIO)
		measure("corpus", corpus, size / FOLIO);
	size_t words = (size_t)256 * FOLIO / 8;
	uint64_t *usemem = malloc(words * 8);
	if (!usemem)
		return 1;
	for (size_t i = 0; i < words; i++)
		usemem[i] = i;
	measure("usemem", (unsigned char *)usemem, 256);
	return 0;
}
