// llama_logits: load a GGUF model with llama.cpp and print the logits of every position of one batch.
//
//     llama_logits [-t THREADS] [-o FILE] [--mtp] [-v] MODEL.gguf TOKEN [TOKEN ...]
//
// MODEL.gguf is a single file or the first file of a gguf-split set (NAME-00001-of-0000N.gguf: llama.cpp
// finds the other files beside it). The TOKENs (decimal ids, as separate arguments or comma-separated)
// are evaluated as one sequence in one batch (positions 0..n-1, one ubatch), with the logits of every
// position requested. The result, n_tokens x n_vocab floats (row-major: position, then token id), is
// written as raw little-endian f32 to FILE, or to stdout without -o. On stderr the last line is
// "llama_logits: n_tokens=N n_vocab=V". --mtp also loads the model's MTP (nextn) layers
// (llama_model_params.load_mtp), so a broken MTP tensor fails the load. llama.cpp's own messages go to
// stderr: warnings and errors always, everything with -v.
//
// Exit status: 0 on success, 1 when the model does not load or the batch does not decode (the reason is
// on stderr), 2 on bad arguments. Built by scripts/llama-cpp.sh against that build's static libllama.

#include "llama.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

static bool g_verbose = false;

static void log_cb(enum ggml_log_level level, const char * text, void * /*user*/) {
    static enum ggml_log_level last = GGML_LOG_LEVEL_INFO;
    // GGML_LOG_LEVEL_CONT continues the previous message at its level.
    if (level != GGML_LOG_LEVEL_CONT) {
        last = level;
    }
    if (g_verbose || last == GGML_LOG_LEVEL_WARN || last == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int usage(const char * msg) {
    if (msg) {
        fprintf(stderr, "llama_logits: %s\n", msg);
    }
    fprintf(stderr, "usage: llama_logits [-t THREADS] [-o FILE] [--mtp] [-v] MODEL.gguf TOKEN [TOKEN ...]\n");
    return 2;
}

static bool parse_tokens(const char * arg, std::vector<llama_token> & out) {
    std::string s(arg);
    size_t start = 0;
    while (start <= s.size()) {
        size_t end = s.find(',', start);
        if (end == std::string::npos) {
            end = s.size();
        }
        std::string item = s.substr(start, end - start);
        if (!item.empty()) {
            char * rest = nullptr;
            errno = 0;
            long v = strtol(item.c_str(), &rest, 10);
            if (errno != 0 || *rest != '\0' || v < 0 || v > INT32_MAX) {
                return false;
            }
            out.push_back((llama_token) v);
        }
        start = end + 1;
    }
    return true;
}

int main(int argc, char ** argv) {
    int          n_threads = 2;
    const char * out_path  = nullptr;
    const char * model_path = nullptr;
    bool         load_mtp  = false;
    std::vector<llama_token> tokens;

    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (++i >= argc) return usage("-t needs a value");
            n_threads = atoi(argv[i]);
            if (n_threads < 1) return usage("-t needs a positive number");
        } else if (!strcmp(a, "-o")) {
            if (++i >= argc) return usage("-o needs a file");
            out_path = argv[i];
        } else if (!strcmp(a, "--mtp")) {
            load_mtp = true;
        } else if (!strcmp(a, "-v")) {
            g_verbose = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(nullptr);
            return 0;
        } else if (!model_path) {
            model_path = a;
        } else if (!parse_tokens(a, tokens)) {
            return usage((std::string("not a token id list: ") + a).c_str());
        }
    }
    if (!model_path) return usage("no model given");
    if (tokens.empty()) return usage("no tokens given");

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.load_mtp     = load_mtp;
    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (!model) {
        fprintf(stderr, "llama_logits: failed to load model %s\n", model_path);
        return 1;
    }
    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int32_t       n_vocab = llama_vocab_n_tokens(vocab);
    const int32_t       n       = (int32_t) tokens.size();
    for (llama_token t : tokens) {
        if (t >= n_vocab) {
            fprintf(stderr, "llama_logits: token %d is not below the vocabulary size %d\n", t, n_vocab);
            return 2;
        }
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = (uint32_t) (n < 64 ? 64 : n);
    cparams.n_batch         = (uint32_t) n;
    cparams.n_ubatch        = (uint32_t) n;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.no_perf         = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "llama_logits: failed to create a context for %s\n", model_path);
        return 1;
    }

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; i++) {
        batch.token[i]     = tokens[i];
        batch.pos[i]       = i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = 1;
    }
    batch.n_tokens = n;
    const int32_t rc = llama_decode(ctx, batch);
    if (rc != 0) {
        fprintf(stderr, "llama_logits: llama_decode returned %d\n", rc);
        return 1;
    }

    FILE * out = out_path ? fopen(out_path, "wb") : stdout;
    if (!out) {
        fprintf(stderr, "llama_logits: cannot open %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    static_assert(sizeof(float) == 4, "f32");
    const uint32_t probe = 1;
    const bool     little = *(const uint8_t *) &probe == 1;
    std::vector<uint8_t> row((size_t) n_vocab * 4);
    for (int32_t i = 0; i < n; i++) {
        const float * lg = llama_get_logits_ith(ctx, i);
        if (!lg) {
            fprintf(stderr, "llama_logits: no logits for position %d\n", i);
            return 1;
        }
        memcpy(row.data(), lg, row.size());
        if (!little) {
            for (size_t k = 0; k < row.size(); k += 4) {
                std::swap(row[k], row[k + 3]);
                std::swap(row[k + 1], row[k + 2]);
            }
        }
        if (fwrite(row.data(), 1, row.size(), out) != row.size()) {
            fprintf(stderr, "llama_logits: write failed: %s\n", strerror(errno));
            return 1;
        }
    }
    if (out != stdout ? fclose(out) != 0 : fflush(out) != 0) {
        fprintf(stderr, "llama_logits: write failed: %s\n", strerror(errno));
        return 1;
    }
    fprintf(stderr, "llama_logits: n_tokens=%d n_vocab=%d\n", n, n_vocab);

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
