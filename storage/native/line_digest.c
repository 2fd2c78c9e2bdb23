/* A SQLite extension: the aggregate `sha256_lines(x)`, the SHA-256 (lowercase hex) of the bytes
 * `group_concat(x, char(10))` builds -- each non-NULL value's `sqlite3_value_text` bytes
 * (`sqlite3_value_bytes` of them), a newline before each but the first, a NULL value skipped --
 * hashed as the rows arrive instead of held as one string; no non-NULL value: the digest of no
 * bytes (what hashing that aggregate's NULL as empty gives). OpenSSL's SHA-256 (libcrypto), fed
 * from a 64 KiB buffer. */
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1
#include <openssl/evp.h>
#include <string.h>

#define BUFFER_BYTES 65536

typedef struct {
  EVP_MD_CTX *md;
  int rows;
  int failed;
  size_t used;
  unsigned char buffer[BUFFER_BYTES];
} LineDigest;

static int feed(LineDigest *d, const unsigned char *bytes, size_t n) {
  if (d->used + n > BUFFER_BYTES) {
    if (d->used && !EVP_DigestUpdate(d->md, d->buffer, d->used)) return 0;
    d->used = 0;
    if (n > BUFFER_BYTES) return EVP_DigestUpdate(d->md, bytes, n);
  }
  memcpy(d->buffer + d->used, bytes, n);
  d->used += n;
  return 1;
}

static void line_step(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  LineDigest *d;
  const unsigned char *text;
  int n;
  (void)argc;
  if (sqlite3_value_type(argv[0]) == SQLITE_NULL) return;
  d = (LineDigest *)sqlite3_aggregate_context(ctx, sizeof(LineDigest));
  if (d == 0) {
    sqlite3_result_error_nomem(ctx);
    return;
  }
  if (d->failed) return;
  if (d->md == 0) {
    d->md = EVP_MD_CTX_new();
    if (d->md == 0 || !EVP_DigestInit_ex(d->md, EVP_sha256(), 0)) {
      d->failed = 1;
      return;
    }
  }
  if (d->rows++ > 0 && !feed(d, (const unsigned char *)"\n", 1)) {
    d->failed = 1;
    return;
  }
  text = sqlite3_value_text(argv[0]);
  n = sqlite3_value_bytes(argv[0]);
  if (text != 0 && n > 0 && !feed(d, text, (size_t)n)) d->failed = 1;
}

static void line_final(sqlite3_context *ctx) {
  static const char hex[] = "0123456789abcdef";
  LineDigest *d = (LineDigest *)sqlite3_aggregate_context(ctx, 0);
  EVP_MD_CTX *md = d ? d->md : 0;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  char text[2 * EVP_MAX_MD_SIZE + 1];
  unsigned int i;
  int ok;
  if (d != 0 && d->failed) {
    if (md) EVP_MD_CTX_free(md);
    sqlite3_result_error(ctx, "sha256_lines: the digest failed", -1);
    return;
  }
  if (md == 0) { /* no row: the digest of no bytes */
    md = EVP_MD_CTX_new();
    ok = md != 0 && EVP_DigestInit_ex(md, EVP_sha256(), 0);
  } else {
    ok = d->used == 0 || EVP_DigestUpdate(md, d->buffer, d->used);
  }
  ok = ok && EVP_DigestFinal_ex(md, out, &n);
  if (md) EVP_MD_CTX_free(md);
  if (d) d->md = 0;
  if (!ok) {
    sqlite3_result_error(ctx, "sha256_lines: the digest failed", -1);
    return;
  }
  for (i = 0; i < n; i++) {
    text[2 * i] = hex[out[i] >> 4];
    text[2 * i + 1] = hex[out[i] & 15];
  }
  sqlite3_result_text(ctx, text, (int)(2 * n), SQLITE_TRANSIENT);
}

#ifdef _WIN32
__declspec(dllexport)
#endif
int sqlite3_linedigest_init(sqlite3 *db, char **error, const sqlite3_api_routines *api) {
  (void)error;
  SQLITE_EXTENSION_INIT2(api);
  return sqlite3_create_function_v2(db, "sha256_lines", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC,
                                    0, 0, line_step, line_final, 0);
}
