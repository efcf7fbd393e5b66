/* An experiment, not shipped: the codec's rANS decode (kernels/rans.py: 4 states, lanes a
   multiple of 4, fp16 bits out, token-major) in AVX2, PAIRS pairs of groups in lockstep, two
   groups to a 256-bit register: the three table lookups of a step are gathers, and a step's
   refill words go to the lanes that need them through a shuffle chosen by the refill mask (as
   in ryg's rans_word_sse41). Same bytes as the numba kernel; measured by
   benchmarks/simd_rans.py (benchmarks/RESULTS.md, "A SIMD rANS decoder, tried"). It reads up
   to 3 bytes past a lookup row and 2 past the dequantization table: fine for the experiment's
   arrays, not for a shipped kernel. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PROB_BITS 12
#define SLOT_MASK 4095u
#define RANS_LOW 65536u
#ifndef PAIRS
#define PAIRS 2
#endif

static uint8_t SHUF[16][16];
static int shuf_ready = 0;

static void build_shuf(void) {
    for (int m = 0; m < 16; m++) {
        int k = 0;
        for (int lane = 0; lane < 4; lane++) {
            for (int b = 0; b < 4; b++) SHUF[m][lane * 4 + b] = 0x80;
            if (m & (1 << lane)) {  /* the k-th word (a 32-bit lane after zero extension) */
                for (int b = 0; b < 4; b++) SHUF[m][lane * 4 + b] = (uint8_t)(k * 4 + b);
                k++;
            }
        }
    }
    shuf_ready = 1;
}

typedef struct {
    const int32_t *lut_at, *fc_at, *dq_at;
    uint16_t *out;
    int64_t p, end;
    uint32_t x[4];
} Group;

/* scalar rows [t_from, n_tok) of one group; returns 0 on a read past its end */
static int scalar_rows(Group *g, int64_t t_from, int64_t n_tok, int64_t nl, const uint16_t *words,
                       const uint8_t *lut, const int64_t *fc, const uint16_t *dq,
                       const int64_t *tok_dq, int64_t row_stride) {
    uint32_t x[4] = {g->x[0], g->x[1], g->x[2], g->x[3]};
    int64_t p = g->p, last = g->end - 1;
    for (int64_t t = t_from; t < n_tok; t++) {
        uint16_t *row = g->out + t * row_stride;
        int64_t d = tok_dq[t];
        for (int64_t j = 0; j < nl; j++) {
            uint32_t xs = x[j & 3];
            uint32_t slot = xs & SLOT_MASK;
            uint32_t s = lut[(int64_t)g->lut_at[j] + slot];
            uint32_t v = (uint32_t)fc[(int64_t)g->fc_at[j] + s];
            xs = (v & 0xFFFF) * (xs >> PROB_BITS) + slot - (v >> 16);
            if (xs < RANS_LOW) { xs = (xs << 16) | words[p < last ? p : last]; p++; }
            x[j & 3] = xs;
            row[j] = dq[d + g->dq_at[j] + s];
        }
    }
    memcpy(g->x, x, sizeof x);
    g->p = p;
    return p <= g->end;
}

static inline __m256i pair_of(const int32_t *a, const int32_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

void kvdesk_rans_decode16(int64_t n_groups, int64_t nl, int64_t n_tok, const uint16_t *words,
                          const int64_t *off, const int32_t *lut_at, const int32_t *fc_at,
                          const int32_t *dq_at, const uint8_t *lut, const int64_t *fc,
                          const uint16_t *dq, const int64_t *tok_dq, uint16_t *out,
                          const int64_t *out_at, int64_t row_stride, uint8_t *ok) {
    if (!shuf_ready) build_shuf();
    const int G = 2 * PAIRS;
    for (int64_t g0 = 0; g0 < n_groups; g0 += G) {
        int ng = (int)(n_groups - g0 < G ? n_groups - g0 : G);
        Group grp[2 * PAIRS];
        int bad[2 * PAIRS] = {0};
        for (int i = 0; i < ng; i++) {
            int64_t g = g0 + i;
            Group *q = &grp[i];
            q->lut_at = lut_at + g * nl; q->fc_at = fc_at + g * nl; q->dq_at = dq_at + g * nl;
            q->out = out + out_at[g];
            q->p = off[g]; q->end = off[g + 1];
            if (q->end - q->p < 8) { bad[i] = 1; q->p = q->end; continue; }
            for (int k = 0; k < 4; k++) { q->x[k] = ((uint32_t)words[q->p] << 16) | words[q->p + 1]; q->p += 2; }
        }
        int64_t t = 0;
        if (ng == G && nl <= 64) {
            int32_t bl[PAIRS][64 * 2], bf[PAIRS][64 * 2], bd[PAIRS][64 * 2];
            int64_t pa[PAIRS], pb[PAIRS];
            for (int i = 0; i < PAIRS; i++) {
                for (int64_t j = 0; j < nl; j += 4)
                    for (int k = 0; k < 4; k++) {
                        bl[i][2*j + k] = grp[2*i].lut_at[j + k]; bl[i][2*j + 4 + k] = grp[2*i+1].lut_at[j + k];
                        bf[i][2*j + k] = grp[2*i].fc_at[j + k]; bf[i][2*j + 4 + k] = grp[2*i+1].fc_at[j + k];
                        bd[i][2*j + k] = grp[2*i].dq_at[j + k]; bd[i][2*j + 4 + k] = grp[2*i+1].dq_at[j + k];
                    }
                pa[i] = grp[2*i].p; pb[i] = grp[2*i+1].p;
            }
            __m256i x[PAIRS];
            for (int i = 0; i < PAIRS; i++)
                x[i] = _mm256_setr_epi32(grp[2*i].x[0], grp[2*i].x[1], grp[2*i].x[2], grp[2*i].x[3],
                                         grp[2*i+1].x[0], grp[2*i+1].x[1], grp[2*i+1].x[2], grp[2*i+1].x[3]);
            const __m256i mask12 = _mm256_set1_epi32(SLOT_MASK), m8 = _mm256_set1_epi32(0xFF),
                          m16 = _mm256_set1_epi32(0xFFFF), zero = _mm256_setzero_si256();
            for (; t < n_tok; t++) {
                /* a row reads at most nl words per group (+4 for the 4-word loads) */
                int room = 1;
                for (int i = 0; i < PAIRS; i++) room &= (pa[i] + nl + 4 <= grp[2*i].end) & (pb[i] + nl + 4 <= grp[2*i+1].end);
                if (!room) break;
                __m256i d = _mm256_set1_epi32((int32_t)tok_dq[t]);
                for (int64_t j = 0; j < nl; j += 4) {
                    for (int i = 0; i < PAIRS; i++) {
                        Group *A = &grp[2*i], *B = &grp[2*i+1];
                        __m256i xi = x[i];
                        __m256i slot = _mm256_and_si256(xi, mask12);
                        __m256i la = _mm256_loadu_si256((const __m256i *)(bl[i] + 2 * j));
                        __m256i s = _mm256_and_si256(_mm256_i32gather_epi32((const int *)lut,
                                        _mm256_add_epi32(la, slot), 1), m8);
                        __m256i fa = _mm256_loadu_si256((const __m256i *)(bf[i] + 2 * j));
                        __m256i v = _mm256_i32gather_epi32((const int *)fc, _mm256_add_epi32(fa, s), 8);
                        xi = _mm256_sub_epi32(_mm256_add_epi32(_mm256_mullo_epi32(
                                 _mm256_and_si256(v, m16), _mm256_srli_epi32(xi, PROB_BITS)), slot),
                                 _mm256_srli_epi32(v, 16));
                        __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(xi, 16), zero);
                        int m = _mm256_movemask_ps(_mm256_castsi256_ps(need));
                        int mA = m & 15, mB = m >> 4;
                        __m128i wA = _mm_loadl_epi64((const __m128i *)(words + pa[i]));
                        __m128i wB = _mm_loadl_epi64((const __m128i *)(words + pb[i]));
                        __m256i w = _mm256_cvtepu16_epi32(_mm_unpacklo_epi64(wA, wB));
                        __m256i ctl = _mm256_inserti128_si256(_mm256_castsi128_si256(
                                          _mm_loadu_si128((const __m128i *)SHUF[mA])),
                                          _mm_loadu_si128((const __m128i *)SHUF[mB]), 1);
                        w = _mm256_shuffle_epi8(w, ctl);
                        xi = _mm256_blendv_epi8(xi, _mm256_or_si256(_mm256_slli_epi32(xi, 16), w), need);
                        pa[i] += __builtin_popcount(mA);
                        pb[i] += __builtin_popcount(mB);
                        x[i] = xi;
                        __m256i qa = _mm256_add_epi32(_mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(bd[i] + 2 * j)), d), s);
                        __m256i val = _mm256_and_si256(_mm256_i32gather_epi32((const int *)dq, qa, 2), m16);
                        __m256i packed = _mm256_packus_epi32(val, val);  /* per 128-bit lane */
                        _mm_storel_epi64((__m128i *)(A->out + t * row_stride + j), _mm256_castsi256_si128(packed));
                        _mm_storel_epi64((__m128i *)(B->out + t * row_stride + j), _mm256_extracti128_si256(packed, 1));
                    }
                }
            }
            for (int i = 0; i < PAIRS; i++) {
                uint32_t tmp[8];
                _mm256_storeu_si256((__m256i *)tmp, x[i]);
                memcpy(grp[2*i].x, tmp, 16); memcpy(grp[2*i+1].x, tmp + 4, 16);
                grp[2*i].p = pa[i]; grp[2*i+1].p = pb[i];
            }
        }
        for (int i = 0; i < ng; i++) {
            Group *q = &grp[i];
            int fine = !bad[i] && scalar_rows(q, t, n_tok, nl, words, lut, fc, dq, tok_dq, row_stride);
            fine = fine && q->p == q->end;
            for (int k = 0; k < 4; k++) fine = fine && q->x[k] == RANS_LOW;
            ok[g0 + i] = (uint8_t)fine;
        }
    }
}
