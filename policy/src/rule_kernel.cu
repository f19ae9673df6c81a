// The canonical sampling rule (policy/src/rule.rs) on the device: one thread block per row of
// logits turns the row and its prescribed uniform into (token u32, log-prob f32).
//
// Mirrors `rule::draw_with` step by step; the one difference is the nucleus threshold, found by
// a bisection over the bit patterns of the weights instead of the CPU's quickselect (no sort,
// no data-dependent partition). `rule_device::emulate` is this file's algorithm on the CPU, and
// is what the CPU tests compare with `rule::draw`. Compiled at run time by NVRTC with
// --fmad=false --ftz=false --prec-div=true: every float operation rounds as on the CPU (Rust
// never contracts a*b+c), so the weights and their sums have the CPU's bits.
//
// Every reduction whose order matters (the f64 sums) is done in the CPU's order: the sum of a
// 256-token block in 8 interleaved lanes combined pairwise, then the remainder, by one thread per
// block; the block sums added one after another by thread 0. Reductions whose order does not
// matter (max, any-NaN, the first index of the maximum) use the usual tree.

#define THREADS 256
#define WALK_BLOCK 256
#define LANES 8
#define TOKEN_BAD 0xFFFFFFFFu       // a NaN or +inf logit
#define TOKEN_NO_FINITE 0xFFFFFFFEu // every logit is -inf

__device__ __forceinline__ float load_f32(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float load_bf16(const unsigned short* p, long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ float load_f16(const unsigned short* p, long i) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(p[i]));
    return f;
}

// Cephes' expf for x <= 0, the constants and operations of `rule::exp_nonpos`.
__device__ __forceinline__ float exp_nonpos(float x) {
    const float LN2_HI = 0.6933594f;
    const float LN2_LO = -2.1219444e-4f;
    const float ROUND = 12582912.0f;
    const float LOG2E = 1.44269504088896340736f;
    float xc = fmaxf(x, -87.0f);
    float t = __fadd_rn(__fmul_rn(xc, LOG2E), ROUND);
    float n = __fsub_rn(t, ROUND);
    int ni = (int)(__float_as_uint(t) - 0x4B400000u);
    float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, LN2_HI)), __fmul_rn(n, LN2_LO));
    float p = __fmul_rn(1.9875691e-4f, r);
    p = __fmul_rn(__fadd_rn(p, 1.3981999e-3f), r);
    p = __fmul_rn(__fadd_rn(p, 8.333452e-3f), r);
    p = __fmul_rn(__fadd_rn(p, 4.1665796e-2f), r);
    p = __fmul_rn(__fadd_rn(p, 1.6666665e-1f), r);
    p = __fmul_rn(__fadd_rn(p, 0.5f), __fmul_rn(r, r));
    p = __fadd_rn(__fadd_rn(p, r), 1.0f);
    float scale = __uint_as_float((unsigned int)((ni + 127) << 23));
    return x < -87.0f ? 0.0f : __fmul_rn(p, scale);
}

// `rule::masked_sum` of e[start .. start+len] (one thread).
__device__ double masked_block(const float* e, long start, int len, float floor) {
    double acc[LANES];
    for (int k = 0; k < LANES; k++) acc[k] = 0.0;
    int full = len / LANES * LANES;
    for (int c = 0; c < full; c += LANES) {
        for (int k = 0; k < LANES; k++) {
            float x = e[start + c + k];
            acc[k] = __dadd_rn(acc[k], x >= floor ? (double)x : 0.0);
        }
    }
    double s = __dadd_rn(__dadd_rn(__dadd_rn(acc[0], acc[4]), __dadd_rn(acc[1], acc[5])),
                         __dadd_rn(__dadd_rn(acc[2], acc[6]), __dadd_rn(acc[3], acc[7])));
    for (int i = full; i < len; i++) {
        float x = e[start + i];
        if (x >= floor) s = __dadd_rn(s, (double)x);
    }
    return s;
}

// The block sums of the row's weights at `floor` into bs[], then their sum in block order
// (thread 0), returned to every thread.
__device__ double total_at(const float* e, int vocab, int nblocks, float floor, double* bs,
                           double* shared_total) {
    for (int b = threadIdx.x; b < nblocks; b += THREADS) {
        long start = (long)b * WALK_BLOCK;
        int len = min(WALK_BLOCK, vocab - b * WALK_BLOCK);
        bs[b] = masked_block(e, start, len, floor);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double z = 0.0;
        for (int b = 0; b < nblocks; b++) z = __dadd_rn(z, bs[b]);
        *shared_total = z;
    }
    __syncthreads();
    double z = *shared_total;
    __syncthreads();
    return z;
}

// One row. `logits` row r starts at r * stride (stride 0: every row reads the same logits, the
// first step after a prefill); `e` holds vocab f32 and `bs` ceil(vocab / 256) f64 per row.
#define RULE_KERNEL(NAME, T, LOAD)                                                              \
extern "C" __global__ void NAME(const T* logits, long stride, int vocab, const double* uniforms, \
                                float inv_t, int greedy, double top_p, float* e_all,           \
                                double* bs_all, unsigned int* out) {                            \
    const int r = blockIdx.x;                                                                   \
    const T* row = logits + (long)r * stride;                                                   \
    const int nblocks = (vocab + WALK_BLOCK - 1) / WALK_BLOCK;                                  \
    float* e = e_all + (long)r * vocab;                                                         \
    double* bs = bs_all + (long)r * nblocks;                                                    \
    __shared__ float s_max[THREADS];                                                            \
    __shared__ int s_bad[THREADS];                                                              \
    __shared__ int s_arg[THREADS];                                                              \
    __shared__ double s_total;                                                                  \
    /* 1. the maximum, and whether any logit is NaN or +inf */                                  \
    float m = -INFINITY;                                                                        \
    int bad = 0;                                                                                \
    for (int i = threadIdx.x; i < vocab; i += THREADS) {                                        \
        float x = LOAD(row, i);                                                                 \
        bad |= isnan(x) || x == INFINITY;                                                       \
        m = x > m ? x : m;                                                                      \
    }                                                                                           \
    s_max[threadIdx.x] = m;                                                                     \
    s_bad[threadIdx.x] = bad;                                                                   \
    __syncthreads();                                                                            \
    for (int w = THREADS / 2; w > 0; w /= 2) {                                                  \
        if (threadIdx.x < w) {                                                                  \
            float o = s_max[threadIdx.x + w];                                                   \
            s_max[threadIdx.x] = o > s_max[threadIdx.x] ? o : s_max[threadIdx.x];               \
            s_bad[threadIdx.x] |= s_bad[threadIdx.x + w];                                       \
        }                                                                                       \
        __syncthreads();                                                                        \
    }                                                                                           \
    m = s_max[0];                                                                               \
    if (s_bad[0] || m == -INFINITY) {                                                           \
        if (threadIdx.x == 0) {                                                                 \
            out[2 * r] = s_bad[0] ? TOKEN_BAD : TOKEN_NO_FINITE;                                \
            out[2 * r + 1] = 0u;                                                                \
        }                                                                                       \
        return;                                                                                 \
    }                                                                                           \
    /* 2. the weights, and Z in the CPU's order */                                              \
    for (int i = threadIdx.x; i < vocab; i += THREADS)                                          \
        e[i] = exp_nonpos(__fmul_rn(__fsub_rn(LOAD(row, i), m), inv_t));                        \
    __syncthreads();                                                                            \
    const double z = total_at(e, vocab, nblocks, -INFINITY, bs, &s_total);                      \
    const double log_z = log(z);                                                                \
    unsigned int tok;                                                                           \
    if (greedy) {                                                                               \
        /* the lowest id among equal maxima */                                                  \
        int arg = vocab;                                                                        \
        for (int i = threadIdx.x; i < vocab; i += THREADS)                                      \
            if (LOAD(row, i) == m && i < arg) arg = i;                                          \
        s_arg[threadIdx.x] = arg;                                                               \
        __syncthreads();                                                                        \
        for (int w = THREADS / 2; w > 0; w /= 2) {                                              \
            if (threadIdx.x < w) s_arg[threadIdx.x] = min(s_arg[threadIdx.x], s_arg[threadIdx.x + w]); \
            __syncthreads();                                                                    \
        }                                                                                       \
        tok = (unsigned int)(s_arg[0] < vocab ? s_arg[0] : 0);                                  \
    } else {                                                                                    \
        /* 3. the nucleus threshold: the largest weight bits b with S(b) >= top_p * Z, where */ \
        /* S(b) is the mass of the weights >= b summed in the CPU's order (S falls as b */      \
        /* grows, so bisection over the bits finds it; that b is always some weight's) */       \
        float tau = 0.0f;                                                                       \
        double mass = z;                                                                        \
        if (top_p < 1.0) {                                                                      \
            const double target = top_p * z;                                                    \
            unsigned int lo = 0u, hi = 0x7F800000u;                                             \
            while (hi - lo > 1u) {                                                              \
                unsigned int mid = lo + (hi - lo) / 2u;                                         \
                double s = total_at(e, vocab, nblocks, __uint_as_float(mid), bs, &s_total);     \
                if (s >= target) lo = mid; else hi = mid;                                       \
            }                                                                                   \
            tau = __uint_as_float(lo);                                                          \
        }                                                                                       \
        /* 4. the inverse CDF in token-id order over the kept weights (e > 0 and e >= tau) */   \
        if (tau > 0.0f) mass = total_at(e, vocab, nblocks, tau, bs, &s_total);                  \
        else total_at(e, vocab, nblocks, -INFINITY, bs, &s_total);                              \
        tok = 0xFFFFFFFDu;                                                                      \
        if (threadIdx.x == 0) {                                                                 \
            const double target = uniforms[r] * mass;                                           \
            double cum = 0.0;                                                                   \
            for (int b = 0; b < nblocks && tok == 0xFFFFFFFDu; b++) {                           \
                double s = bs[b];                                                               \
                if (__dadd_rn(cum, s) <= target) { cum = __dadd_rn(cum, s); continue; }         \
                int len = min(WALK_BLOCK, vocab - b * WALK_BLOCK);                              \
                for (int k = 0; k < len; k++) {                                                 \
                    float x = e[(long)b * WALK_BLOCK + k];                                      \
                    if (x > 0.0f && x >= tau) {                                                 \
                        cum = __dadd_rn(cum, (double)x);                                        \
                        if (cum > target) { tok = (unsigned int)(b * WALK_BLOCK + k); break; }  \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
            if (tok == 0xFFFFFFFDu) {                                                           \
                /* u * M rounded past the sum: the last kept token */                           \
                tok = 0u;                                                                       \
                for (int i = vocab - 1; i >= 0; i--)                                            \
                    if (e[i] > 0.0f && e[i] >= tau) { tok = (unsigned int)i; break; }           \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    if (threadIdx.x == 0) {                                                                     \
        float lp = (float)((double)__fmul_rn(__fsub_rn(LOAD(row, tok), m), inv_t) - log_z);     \
        out[2 * r] = tok;                                                                       \
        out[2 * r + 1] = __float_as_uint(lp);                                                   \
    }                                                                                           \
}

RULE_KERNEL(rule_rows_f32, float, load_f32)
RULE_KERNEL(rule_rows_bf16, unsigned short, load_bf16)
RULE_KERNEL(rule_rows_f16, unsigned short, load_f16)
