// A direct 2-D convolution for images of few channels (a network's first convolution): NCHW float32 input,
// output (N, OH, OW, C_out) channels-last, the bias and a ReLU or SiLU applied in registers. Included by
// ort_gemm_op.cpp (korch_ort::direct_conv); backends/direct_conv.py says which convolutions take it.
//
// GEMM libraries lay such a convolution out as a product of K = C_in * KH * KW by a few output channels, and
// on AVX-512 each FMA then needs a broadcast load of its own (oneDNN: 47% of this Xeon's FMA peak on
// YOLOX-Nano's 6x6 stride-2 stem, 3 -> 16 channels). Here each input element is broadcast once and multiplied
// by every weight vector it meets within a tile of P output pixels of one row (up to KW / S taps times G
// vectors of 16 output channels), the tile's P * G sums held in registers: about 80% of the peak on the same stem.
// The input is read as it lies (no copy into channels-last), padding by a zero-filled copy of a tile's input
// row at the image's left and right edges.
//
// The code is written with GCC's vector extensions and compiled twice (AVX-512 and AVX2 with FMA, by
// `#pragma GCC target`), the caller choosing by the CPU it runs on; a vector of 16 floats is one zmm register
// or two ymm ones. The AVX2 code spills its tiles (16 ymm registers): on this Xeon it took 7.8 ms where the
// AVX-512 code took 1.6 on YOLOX-Nano's stem, so on an AVX2 CPU choose_unit will keep oneDNN's convolution.

#ifndef KORCH_DIRECT_CONV_BODY

#include <cstdint>
#include <cstdlib>

namespace korch_direct {

struct Shape {
  int64_t n, c, h, w;     // input
  int64_t oh, ow, cout;   // output
  int kh, kw, stride, pad_top, pad_left;
  int activation;         // kNone, kRelu, kSilu
};
enum Activation : int { kNone = 0, kRelu = 1, kSilu = 2 };

}  // namespace korch_direct

#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=fast")
#pragma GCC target("avx512f,avx512dq,avx2,fma")
namespace korch_direct::avx512 {
#define KORCH_DIRECT_CONV_BODY
#include "direct_conv.h"
#undef KORCH_DIRECT_CONV_BODY
}  // namespace korch_direct::avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC optimize("O3", "fp-contract=fast")
#pragma GCC target("avx2,fma")
namespace korch_direct::avx2 {
#define KORCH_DIRECT_CONV_BODY
#include "direct_conv.h"
#undef KORCH_DIRECT_CONV_BODY
}  // namespace korch_direct::avx2
#pragma GCC pop_options

namespace korch_direct {

// Whether `run` computes this shape: the strides and kernel widths it is compiled for (3x3 ones, YOLOX's 6x6
// stride-2 Focus, ResNet's 7x7 stride-2 and Segformer's 7x7 stride-4 stems), 1, 2 or 4 vectors of 16 output
// channels.
inline bool supported(int stride, int kw, int64_t cout) {
  bool taps = (stride == 1 && kw == 3) || (stride == 2 && (kw == 3 || kw == 6 || kw == 7)) || (stride == 4 && kw == 7);
  return taps && (cout == 16 || cout == 32 || cout == 64);
}

// x: (N, C, H, W); w: (C, KH, KW, C_out) (the weight's taps outermost, its output channels innermost); b:
// (C_out); out: (N, OH, OW, C_out). Rows of output run in parallel on OpenMP's threads.
// KORCH_DIRECT_CONV_AVX2 set in the environment takes the AVX2 code on an AVX-512 CPU too (its tests do).
inline void run(const float* x, const float* w, const float* b, float* out, const Shape& s) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                             std::getenv("KORCH_DIRECT_CONV_AVX2") == nullptr;
  if (avx512)
    avx512::run(x, w, b, out, s);
  else
    avx2::run(x, w, b, out, s);
}

}  // namespace korch_direct

#else  // the body, compiled once per target

typedef float Vec __attribute__((vector_size(64)));
typedef float UnalignedVec __attribute__((vector_size(64), aligned(4)));
typedef int32_t IVec __attribute__((vector_size(64)));

// (a brace list: `Vec{} + v` costs an addition, which IEEE's -0 keeps the compiler from leaving out)
static inline Vec splat(float v) { return Vec{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }

static inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }

static inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }

// e^x within a few ulp: x = n ln 2 + r, e^r by a degree-6 polynomial (Cephes' expf), 2^n into the exponent
static inline Vec exp_of(Vec x) {
  x = x > splat(88.3f) ? splat(88.3f) : x;
  x = x < splat(-87.3f) ? splat(-87.3f) : x;
  const Vec round = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  Vec n = (x * 1.44269504088896341f + round) - round;
  Vec r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.0f;
  IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

static inline Vec activate(Vec v, int activation) {
  if (activation == korch_direct::kRelu) return v > splat(0.0f) ? v : splat(0.0f);
  if (activation == korch_direct::kSilu) return v / (exp_of(-v) + 1.0f);
  return v;
}

// One tile: P output pixels of row `oy` from column `ox0`, G vectors of 16 output channels. EDGE: some of
// its input columns lie outside the image (read through a zero-padded copy).
template <int P, int G, int S, int KW, bool EDGE>
static void tile(const float* x, const float* w, const float* b, float* out, const korch_direct::Shape& s,
                 int64_t image, int64_t oy, int64_t ox0) {
  constexpr int N = (P - 1) * S + KW;  // input columns the tile reads
  const int64_t cout = 16 * G;
  Vec acc[P][G];
  for (int g = 0; g < G; ++g) {
    Vec bias = load(b + 16 * g);
    for (int p = 0; p < P; ++p) acc[p][g] = bias;
  }
  const int64_t iy0 = oy * S - s.pad_top, ix0 = ox0 * S - s.pad_left;
  float padded[N];
  for (int64_t c = 0; c < s.c; ++c)
    for (int ky = 0; ky < s.kh; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= s.h) continue;
      const float* row = x + ((image * s.c + c) * s.h + iy) * s.w;
      const float* seg = row + ix0;
      if (EDGE) {
        for (int k = 0; k < N; ++k) padded[k] = (ix0 + k >= 0 && ix0 + k < s.w) ? row[ix0 + k] : 0.0f;
        seg = padded;
      }
      const float* wk = w + (c * s.kh + ky) * KW * cout;
      Vec taps[KW][G];  // the row's taps: in registers where they fit beside the sums, else read from L1
      for (int kx = 0; kx < KW; ++kx)
        for (int g = 0; g < G; ++g) taps[kx][g] = load(wk + kx * cout + 16 * g);
      // input column j meets output pixel p through tap kx = j - p * S
#pragma GCC unroll 64
      for (int j = 0; j < N; ++j) {
        const Vec v = splat(seg[j]);
#pragma GCC unroll 16
        for (int kx = 0; kx < KW; ++kx) {
          const int d = j - kx;
          if (d >= 0 && d % S == 0 && d / S < P)
            for (int g = 0; g < G; ++g) acc[d / S][g] += v * taps[kx][g];
        }
      }
    }
  float* o = out + ((image * s.oh + oy) * s.ow + ox0) * cout;
  for (int p = 0; p < P; ++p)
    for (int g = 0; g < G; ++g) store(o + p * cout + 16 * g, activate(acc[p][g], s.activation));
}

template <int G, int S, int KW>
static void rows(const float* x, const float* w, const float* b, float* out, const korch_direct::Shape& s) {
  constexpr int P = 16 / G;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.n * s.oh; ++row) {
    const int64_t image = row / s.oh, oy = row % s.oh;
    int64_t ox = 0;
    for (; ox + P <= s.ow; ox += P) {
      const int64_t ix0 = ox * S - s.pad_left;
      if (ix0 >= 0 && ix0 + (P - 1) * S + KW <= s.w)
        tile<P, G, S, KW, false>(x, w, b, out, s, image, oy, ox);
      else
        tile<P, G, S, KW, true>(x, w, b, out, s, image, oy, ox);
    }
    for (; ox < s.ow; ++ox) tile<1, G, S, KW, true>(x, w, b, out, s, image, oy, ox);
  }
}

template <int S, int KW>
static void by_width(const float* x, const float* w, const float* b, float* out, const korch_direct::Shape& s) {
  if (s.cout == 16)
    rows<1, S, KW>(x, w, b, out, s);
  else if (s.cout == 32)
    rows<2, S, KW>(x, w, b, out, s);
  else
    rows<4, S, KW>(x, w, b, out, s);
}

// a shape korch_direct::supported accepts
inline void run(const float* x, const float* w, const float* b, float* out, const korch_direct::Shape& s) {
  if (s.stride == 1)
    by_width<1, 3>(x, w, b, out, s);
  else if (s.stride == 4)
    by_width<4, 7>(x, w, b, out, s);
  else if (s.kw == 3)
    by_width<2, 3>(x, w, b, out, s);
  else if (s.kw == 6)
    by_width<2, 6>(x, w, b, out, s);
  else
    by_width<2, 7>(x, w, b, out, s);
}

#endif
