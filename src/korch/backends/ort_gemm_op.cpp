// korch_ort::matmul (a product by a constant weight; korch_ort::matmul_blocks leaves it in column blocks),
// korch_ort::batched_matmul (a product of two activations) and korch_ort::softmax, computed by ONNX Runtime's
// MLAS, called from a compiled unit with no Python in between (backends/ort_gemm.py builds and loads this file);
// and korch_ort::mkl_matmul, a product by a constant weight in MKL's packed GEMM, which a unit cannot hold
// otherwise (below, before it); and korch_ort::direct_conv, a network's first convolution computed directly
// (direct_conv.h, no ONNX Runtime in it).
//
// Each weight gets one-MatMul ONNX Runtime sessions with one intra-op thread each (MLAS packs the weight
// once, when a session opens), run on torch's own threads (at::parallel_for): ONNX Runtime's thread pools
// never start, so MLAS never waits for cores that torch's OpenMP workers hold. A small weight (at most
// kRowSplitBytes) multiplied by enough rows has a session per thread (one above kPerThreadBytes) and the
// threads split the rows. A larger one, or one first called with too few rows to split (one token of a
// decoder), is cut into column blocks, a session each, and each thread multiplies every row by its block, so
// that it streams its share of the weight, not all of it (rows split made both threads read the whole weight:
// 4% slower on ViT's 197x768x3072 product), at the cost of copying its block of the result into place.
//
// ONNX Runtime's C API is a table of function pointers whose order its authors never change (struct OrtApi in
// onnxruntime_c_api.h; the wheel ships the library, not the header): korch names the slots it calls.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <torch/library.h>

#include "direct_conv.h"

#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct OrtStatus;
struct OrtEnv;
struct OrtSession;
struct OrtSessionOptions;
struct OrtValue;
struct OrtMemoryInfo;

// slots of struct OrtApi (stable since ONNX Runtime 1.x: only appended to)
enum Slot : int {
  kGetErrorMessage = 2,
  kCreateEnv = 3,
  kCreateSessionFromArray = 8,
  kRun = 9,
  kCreateSessionOptions = 10,
  kSetSessionGraphOptimizationLevel = 23,
  kSetIntraOpNumThreads = 24,
  kSetInterOpNumThreads = 25,
  kCreateTensorWithDataAsOrtValue = 49,
  kCreateCpuMemoryInfo = 69,
  kReleaseStatus = 93,
  kReleaseSession = 95,
  kReleaseValue = 96,
  kReleaseSessionOptions = 100,
};
constexpr uint32_t kApiVersion = 16;  // ONNX Runtime 1.16 and later serve this table
constexpr int kLoggingError = 3, kEnableAll = 99, kFloat = 1, kDeviceAllocator = 0, kMemTypeDefault = 0;
// columns per block below which a weight is cut into fewer blocks than torch has threads
constexpr int64_t kMinColumnsPerBlock = 64;
// weights of at most this many bytes are not cut: the threads split the rows (at least kMinRows each)
constexpr int64_t kRowSplitBytes = 4 << 20;
constexpr int64_t kMinRows = 16;
// ...and a weight above kPerThreadBytes only where each thread gets this many rows at least: fewer (a 7x7
// feature map's 49 pixels) cut it into column blocks, so that each thread streams its share of the weight, not
// all of it (2 threads, fastest of 5 turns, two runs: MobileNetV2's 49x320x1280 product 6-13% faster,
// 49x960x320 8-14%; a 368 KB weight by 49 rows ran 8% slower in blocks, 196 rows alike either way)
constexpr int64_t kMinRowsPerThread = 64;
// a weight whose threads split the rows gets a session per thread up to this many bytes and one they share above
// it: each session packs a copy of the weight (BERT-base's twelve 768x768 output projections: 28 MB more), and a
// larger weight's products are long beside the lock (the ViT block's all-MLAS unit, 768x768 weights: median
// call 7.1 ms either way)
constexpr int64_t kPerThreadBytes = 1 << 20;

struct OrtApiBase {
  const void* const* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// a contiguous float32 array ONNX Runtime reads or writes in place
struct Array {
  float* data;
  std::vector<int64_t> shape;
};

class Runtime {
 public:
  explicit Runtime(const std::string& library) {
    handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(handle_, "korch_ort: cannot open ONNX Runtime's library ", library, ": ", dlerror());
    auto base = reinterpret_cast<const OrtApiBase* (*)()>(dlsym(handle_, "OrtGetApiBase"));
    TORCH_CHECK(base, "korch_ort: ", library, " has no OrtGetApiBase");
    api_ = base()->GetApi(kApiVersion);
    TORCH_CHECK(api_, "korch_ort: ONNX Runtime ", base()->GetVersionString(), " does not serve API version ",
                kApiVersion);
    check(call<OrtStatus* (*)(int, const char*, OrtEnv**)>(kCreateEnv)(kLoggingError, "korch", &env_));
    check(call<OrtStatus* (*)(int, int, OrtMemoryInfo**)>(kCreateCpuMemoryInfo)(kDeviceAllocator, kMemTypeDefault,
                                                                                &cpu_));
  }

  template <typename F>
  F call(Slot slot) const {
    return reinterpret_cast<F>(const_cast<void*>(api_[slot]));
  }

  void check(OrtStatus* status) const {
    if (status == nullptr) return;
    std::string message = call<const char* (*)(const OrtStatus*)>(kGetErrorMessage)(status);
    call<void (*)(OrtStatus*)>(kReleaseStatus)(status);
    TORCH_CHECK(false, "korch_ort: ONNX Runtime: ", message);
  }

  OrtSession* open(const at::Tensor& model) const {
    OrtSessionOptions* options = nullptr;
    check(call<OrtStatus* (*)(OrtSessionOptions**)>(kCreateSessionOptions)(&options));
    std::unique_ptr<OrtSessionOptions, void (*)(OrtSessionOptions*)> owned(
        options, call<void (*)(OrtSessionOptions*)>(kReleaseSessionOptions));
    check(call<OrtStatus* (*)(OrtSessionOptions*, int)>(kSetIntraOpNumThreads)(options, 1));
    check(call<OrtStatus* (*)(OrtSessionOptions*, int)>(kSetInterOpNumThreads)(options, 1));
    check(call<OrtStatus* (*)(OrtSessionOptions*, int)>(kSetSessionGraphOptimizationLevel)(options, kEnableAll));
    OrtSession* session = nullptr;
    check(call<OrtStatus* (*)(const OrtEnv*, const void*, size_t, const OrtSessionOptions*, OrtSession**)>(
        kCreateSessionFromArray)(env_, model.data_ptr(), model.numel(), options, &session));
    return session;
  }

  // y[rows, n] = x[rows, k] @ w, through ``session``; x and y contiguous
  void run(OrtSession* session, float* x, float* y, int64_t rows, int64_t k, int64_t n) const {
    run(session, {{x, {rows, k}}}, {y, {rows, n}});
  }

  // output ``y`` of ``session`` (named y) at its inputs (named x, then b): contiguous float32 arrays
  void run(OrtSession* session, const std::vector<Array>& inputs, const Array& y) const {
    static const char* const kInputNames[] = {"x", "b"};
    TORCH_CHECK(inputs.size() <= 2, "korch_ort: at most two inputs");
    auto release = call<void (*)(OrtValue*)>(kReleaseValue);
    std::vector<std::unique_ptr<OrtValue, void (*)(OrtValue*)>> owned;
    std::vector<const OrtValue*> values;
    for (const Array& array : inputs) {
      owned.emplace_back(value_of(array), release);
      values.push_back(owned.back().get());
    }
    OrtValue* output = value_of(y);
    std::unique_ptr<OrtValue, void (*)(OrtValue*)> owned_output(output, release);
    const char* output_name = "y";
    check(call<OrtStatus* (*)(OrtSession*, const void*, const char* const*, const OrtValue* const*, size_t,
                              const char* const*, size_t, OrtValue**)>(kRun)(
        session, nullptr, kInputNames, values.data(), values.size(), &output_name, 1, &output));
  }

 private:
  OrtValue* value_of(const Array& array) const {
    int64_t elements = 1;
    for (int64_t d : array.shape) elements *= d;
    OrtValue* value = nullptr;
    check(call<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
        kCreateTensorWithDataAsOrtValue)(cpu_, array.data, elements * sizeof(float), array.shape.data(),
                                         array.shape.size(), kFloat, &value));
    return value;
  }

  void* handle_ = nullptr;
  const void* const* api_ = nullptr;
  OrtEnv* env_ = nullptr;
  OrtMemoryInfo* cpu_ = nullptr;
};

// ONNX Runtime's Run takes a lock of its session: two threads running one session wait on each other in the
// kernel (futex) when one arrives while the other runs: YOLOX-Nano's unit, 77 products of small weights, ran its
// median call in 6.05 ms with one session a weight and 5.3 ms with one a thread. So every thread runs sessions of
// its own: a weight whose threads split the rows has a session per thread, an activation operator too.
struct Gemm {
  // blocks == 1: sessions of the whole weight, one per torch thread (one in all above kPerThreadBytes); else
  // one per column block
  std::vector<OrtSession*> sessions;
  int64_t blocks, k, n;

  // block b's first column (b = blocks: n): the blocks cut n as evenly as integers allow
  int64_t start(int64_t b) const { return n * b / blocks; }
};

// the calling thread's session of ``sessions`` (one per torch thread)
OrtSession* own(const std::vector<OrtSession*>& sessions) {
  return sessions[at::get_thread_num() % sessions.size()];
}

std::mutex lock;
std::unique_ptr<Runtime> runtime;
// (unit token, slot) -> its sessions, which live until close_unit(unit) or as long as the process
std::map<std::pair<int64_t, int64_t>, Gemm> gemms;
// (unit token, slot, kind) -> the sessions of an activation operator, one per torch thread
std::map<std::tuple<int64_t, int64_t, std::string>, std::vector<OrtSession*>> op_sessions;
// a weight MKL packed (mkl_matmul, below)
struct MklWeight {
  at::Tensor packed, weight;  // weight: (n, k), a linear layer's, which _mkl_linear takes beside the packed one
  int64_t rows;
};
// (unit token, slot) -> its weight, packed
std::map<std::pair<int64_t, int64_t>, MklWeight> mkl_weights;
// a convolution in ONNX Runtime's blocked layout (nchwc_conv, below)
struct NchwcConv {
  std::vector<OrtSession*> sessions;  // one per part, its output blocks first_block(p) .. first_block(p + 1)
  int64_t out_blocks;

  int64_t first_block(int64_t p) const { return out_blocks * p / static_cast<int64_t>(sessions.size()); }
};
// (unit token, slot) -> its sessions
std::map<std::pair<int64_t, int64_t>, NchwcConv> nchwc_convs;


void open_runtime(c10::string_view library) {
  std::lock_guard<std::mutex> guard(lock);
  if (!runtime) runtime = std::make_unique<Runtime>(std::string(library));
}

// the slot's sessions, opened on its first call (``rows``: that call's row count), in ``blocks`` column blocks
// where that is positive, else as the weight's size and ``rows`` suggest
const Gemm& gemm_for(const at::Tensor& w, int64_t unit, int64_t slot, int64_t rows, int64_t blocks = 0) {
  std::lock_guard<std::mutex> guard(lock);
  TORCH_CHECK(runtime, "korch_ort: ONNX Runtime's library is not open (korch.backends.ort_gemm opens it)");
  auto found = gemms.find({unit, slot});
  if (found == gemms.end()) {
    // the one-MatMul model holding a block of this weight, serialized by korch in Python (backends/ort_gemm.py)
    static auto model_of = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("korch::ort_gemm_model", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    const int64_t n = w.size(1), threads = at::get_num_threads();
    const bool few_rows = rows < kMinRowsPerThread * threads && w.numel() * 4 > kPerThreadBytes &&
                          n / kMinColumnsPerBlock >= 2;
    const bool split_rows = w.numel() * 4 <= kRowSplitBytes && rows >= 2 * kMinRows && !few_rows;
    if (blocks <= 0) {
      blocks = split_rows ? 1 : std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinColumnsPerBlock));
    }
    Gemm gemm{{}, blocks, w.size(0), n};
    if (blocks == 1) {
      at::Tensor model = model_of.call(w.contiguous());
      const int copies = w.numel() * 4 <= kPerThreadBytes ? at::get_num_threads() : 1;
      for (int t = 0; t < copies; ++t) gemm.sessions.push_back(runtime->open(model));
    }
    for (int64_t b = 0; blocks > 1 && b < blocks; ++b) {
      at::Tensor block = w.narrow(1, gemm.start(b), gemm.start(b + 1) - gemm.start(b)).contiguous();
      gemm.sessions.push_back(runtime->open(model_of.call(block)));
    }
    found = gemms.emplace(std::make_pair(unit, slot), std::move(gemm)).first;
  }
  TORCH_CHECK(found->second.k == w.size(0) && found->second.n == w.size(1), "korch_ort: unit ", unit, " slot ",
              slot, " was opened for a ", found->second.k, "x", found->second.n, " weight, called with ", w.size(0),
              "x", w.size(1));
  return found->second;
}

// ``leading`` sizes, then ``last``
std::vector<int64_t> with_last(at::IntArrayRef leading, int64_t last) {
  std::vector<int64_t> shape(leading.begin(), leading.end());
  shape.push_back(last);
  return shape;
}

at::Tensor matmul(const at::Tensor& x, const at::Tensor& w, int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2,
              "korch_ort::matmul multiplies float32 rows by a float32 matrix");
  at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
  const Gemm& gemm = gemm_for(w, unit, slot, rows.size(0));
  const int64_t m = rows.size(0), k = gemm.k, n = gemm.n;
  const int64_t blocks = gemm.blocks;
  at::Tensor out = at::empty({m, n}, x.options());
  float* x_data = rows.data_ptr<float>();
  if (blocks == 1) {
    float* y_data = out.data_ptr<float>();
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), m / kMinRows));
    at::parallel_for(0, m, (m + threads - 1) / threads, [&](int64_t begin, int64_t end) {
      runtime->run(own(gemm.sessions), x_data + begin * k, y_data + begin * n, end - begin, k, n);
    });
  } else {
    // ONNX Runtime writes contiguous outputs: each block's product lands in its own part of ``scratch`` and
    // is copied into its columns of ``out`` (plain memory: worker threads run no ATen operators, whose
    // thread-local state, inference mode included, is the calling thread's alone)
    at::Tensor scratch = at::empty({m * n}, x.options());
    float* scratch_data = scratch.data_ptr<float>();
    float* y_data = out.data_ptr<float>();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t first = gemm.start(b), columns = gemm.start(b + 1) - first;
        float* block = scratch_data + m * first;
        runtime->run(gemm.sessions[b], x_data, block, m, k, columns);
        for (int64_t r = 0; r < m; ++r) {
          std::memcpy(y_data + r * n + first, block + r * columns, columns * sizeof(float));
        }
      }
    });
  }
  return out.view(with_last(x.sizes().slice(0, x.dim() - 1), n));
}

// x @ w as its ``blocks`` column blocks side by side, (blocks, rows, n / blocks): each thread writes its blocks'
// products where they lie, with no copy into the columns of one (rows, n) array (3-5% of a 197x768x3072
// product). A compiled unit's kernels read the product through a view (``ort_gemm.product_function``).
at::Tensor matmul_blocks(const at::Tensor& x, const at::Tensor& w, int64_t unit, int64_t slot, int64_t blocks) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2 && blocks > 0 &&
                  w.size(1) % blocks == 0,
              "korch_ort::matmul_blocks multiplies float32 rows by a float32 matrix of columns divisible by ", blocks);
  at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
  const Gemm& gemm = gemm_for(w, unit, slot, rows.size(0), blocks);
  TORCH_CHECK(gemm.blocks == blocks, "korch_ort: unit ", unit, " slot ", slot, " was opened in ", gemm.blocks,
              " blocks, called with ", blocks);
  const int64_t m = rows.size(0), k = gemm.k, columns = gemm.n / blocks;
  at::Tensor out = at::empty({blocks, m, columns}, x.options());
  float *x_data = rows.data_ptr<float>(), *y_data = out.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      runtime->run(gemm.sessions[b], x_data, y_data + b * m * columns, m, k, columns);
    }
  });
  return out;
}

// releases the sessions of ``unit`` (a measured kernel that is dropped; a unit's live as long as the process)
void close_unit(int64_t unit) {
  std::lock_guard<std::mutex> guard(lock);
  for (auto it = mkl_weights.lower_bound({unit, INT64_MIN}); it != mkl_weights.end() && it->first.first == unit;) {
    it = mkl_weights.erase(it);
  }
  if (!runtime) return;
  auto release = runtime->call<void (*)(OrtSession*)>(kReleaseSession);
  for (auto it = gemms.lower_bound({unit, INT64_MIN}); it != gemms.end() && it->first.first == unit;) {
    for (OrtSession* session : it->second.sessions) release(session);
    it = gemms.erase(it);
  }
  for (auto it = nchwc_convs.lower_bound({unit, INT64_MIN}); it != nchwc_convs.end() && it->first.first == unit;) {
    for (OrtSession* session : it->second.sessions) release(session);
    it = nchwc_convs.erase(it);
  }
  for (auto it = op_sessions.begin(); it != op_sessions.end();) {
    if (std::get<0>(it->first) == unit) {
      for (OrtSession* session : it->second) release(session);
      it = op_sessions.erase(it);
    } else {
      ++it;
    }
  }
}

// MKL's packed GEMM (ATen's mkl::_mkl_linear) for a product by a constant weight. Inductor packs a weight so
// only when it compiles in process: MKL's packed matrix holds its own address, so a package cannot carry it
// (torch/_inductor/fx_passes/mkldnn_fusion.py), and AOTInductor's units get oneDNN's packed GEMM instead. Here
// the weight is packed on the slot's first call, for that call's row count (MKL packs for one), and kept where
// it was packed until close_unit. On the AVX-512 Xeon it multiplies ViT's and BERT's products 4-10% faster than
// MLAS or oneDNN (benchmarks/gemm_paths.py).
at::Tensor mkl_matmul(const at::Tensor& x, const at::Tensor& w, int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2 &&
                  x.size(-1) == w.size(0),
              "korch_ort::mkl_matmul multiplies float32 rows by a float32 matrix, got ", x.sizes(), " and ",
              w.sizes());
  static auto reorder = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("mkl::_mkl_reorder_linear_weight", "")
                            .typed<at::Tensor(const at::Tensor&, int64_t)>();
  static auto linear = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("mkl::_mkl_linear", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             const std::optional<at::Tensor>&, int64_t)>();
  at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
  const MklWeight* weight;
  {
    std::lock_guard<std::mutex> guard(lock);
    auto found = mkl_weights.find({unit, slot});
    if (found == mkl_weights.end()) {
      at::Tensor columns_first = w.t().contiguous();
      at::Tensor packed = reorder.call(columns_first, rows.size(0));
      found = mkl_weights.emplace(std::make_pair(unit, slot), MklWeight{packed, columns_first, rows.size(0)}).first;
    }
    weight = &found->second;
  }
  TORCH_CHECK(weight->weight.size(0) == w.size(1) && weight->weight.size(1) == w.size(0), "korch_ort: unit ", unit,
              " slot ", slot, " was packed for a ", weight->weight.size(1), "x", weight->weight.size(0),
              " weight, called with ", w.size(0), "x", w.size(1));
  // a call of another row count than the packed one multiplies by the weight as it is (_mkl_linear's own rule)
  at::Tensor out = linear.call(rows, weight->packed, weight->weight, std::nullopt, weight->rows);
  return out.view(with_last(x.sizes().slice(0, x.dim() - 1), w.size(1)));
}

// the sessions of activation operator ``kind`` (a model korch::ort_op_model serializes) at (unit, slot), one
// per torch thread (``own`` picks the calling thread's)
const std::vector<OrtSession*>& op_session(const std::string& kind, int64_t unit, int64_t slot) {
  std::lock_guard<std::mutex> guard(lock);
  TORCH_CHECK(runtime, "korch_ort: ONNX Runtime's library is not open (korch.backends.ort_gemm opens it)");
  std::vector<OrtSession*>& sessions = op_sessions[{unit, slot, kind}];
  if (sessions.empty()) {
    static auto model_of = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("korch::ort_op_model", "")
                               .typed<at::Tensor(c10::string_view)>();
    at::Tensor model = model_of.call(kind);
    for (int t = 0; t < at::get_num_threads(); ++t) sessions.push_back(runtime->open(model));
  }
  return sessions;
}

// a @ b over equal leading (batch) axes, neither a constant. The threads split the batches, and the rows of
// each batch where there are fewer batches than threads. A b whose last two axes are a transposed
// contiguous array (attention's keys) is read as it lies, by FusedMatMul's transB.
at::Tensor batched_matmul(const at::Tensor& a, const at::Tensor& b, int64_t unit, int64_t slot) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.dim() >= 2 &&
                  a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
                  a.size(-1) == b.size(-2),
              "korch_ort::batched_matmul multiplies float32 arrays of equal batch axes, got ", a.sizes(), " and ",
              b.sizes());
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const bool trans_b = !b.is_contiguous() && b.transpose(-1, -2).is_contiguous();
  at::Tensor a3 = a.reshape({-1, m, k}).contiguous();
  at::Tensor b3 = trans_b ? b.transpose(-1, -2).reshape({-1, n, k}) : b.reshape({-1, k, n}).contiguous();
  const std::vector<OrtSession*>& sessions = op_session(trans_b ? "matmul_transb" : "matmul", unit, slot);
  const int64_t batches = a3.size(0);
  at::Tensor out = at::empty({batches, m, n}, a.options());
  const int64_t threads = at::get_num_threads();
  const int64_t row_blocks =
      batches >= threads ? 1 : std::max<int64_t>(1, std::min<int64_t>((threads + batches - 1) / batches, m / kMinRows));
  float *a_data = a3.data_ptr<float>(), *b_data = b3.data_ptr<float>(), *y_data = out.data_ptr<float>();
  const int64_t b_rows = trans_b ? n : k, b_columns = trans_b ? k : n;
  at::parallel_for(0, batches * row_blocks, 1, [&](int64_t begin, int64_t end) {
    if (row_blocks == 1) {  // whole batches, one call
      const int64_t count = end - begin;
      runtime->run(own(sessions),
                   {{a_data + begin * m * k, {count, m, k}}, {b_data + begin * k * n, {count, b_rows, b_columns}}},
                   {y_data + begin * m * n, {count, m, n}});
      return;
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t batch = item / row_blocks, block = item % row_blocks;
      const int64_t first = m * block / row_blocks, rows = m * (block + 1) / row_blocks - first;
      runtime->run(own(sessions), {{a_data + (batch * m + first) * k, {1, rows, k}},
                             {b_data + batch * k * n, {1, b_rows, b_columns}}},
                   {y_data + (batch * m + first) * n, {1, rows, n}});
    }
  });
  return out.view(with_last(a.sizes().slice(0, a.dim() - 1), n));
}

// softmax over the last axis, its rows split among the threads
at::Tensor softmax(const at::Tensor& x, int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1, "korch_ort::softmax takes float32, got ",
              x.scalar_type());
  at::Tensor rows = x.contiguous();
  const int64_t c = x.size(-1), count = c == 0 ? 0 : rows.numel() / c;
  at::Tensor out = at::empty_like(rows);
  if (count == 0) return out;
  const std::vector<OrtSession*>& sessions = op_session("softmax", unit, slot);
  float *x_data = rows.data_ptr<float>(), *y_data = out.data_ptr<float>();
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count / kMinRows));
  at::parallel_for(0, count, (count + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    runtime->run(own(sessions), {{x_data + begin * c, {end - begin, c}}}, {y_data + begin * c, {end - begin, c}});
  });
  return out;
}

// A convolution in ONNX Runtime's blocked layout (its com.microsoft.nchwc Conv, bias, residual sum and activation
// inside): values are (N, C/B, H, W, B) arrays, channels padded to MLAS's block B, so that one convolution reads
// what another wrote with no reorder between them (backends/nchwc.py). The threads split the output blocks, each
// running a session of its blocks' weights (a depthwise one reads only its blocks of the input too); ONNX
// Runtime's own pool never starts (beside torch's OpenMP workers a convolution and a loop took twice their sum,
// its spinning on or off). Split by output rows instead, through buffers of each thread's own where a part's
// rows are not one run (MLAS computes up to four output blocks per pass over the input, and a part of one or two
// blocks cannot), ResNet's and MobileNetV2's units ran no faster (BENCHMARKS.md, thirty-fifth session).

// spec: block, kernel (2), strides (2), pads (top, left, bottom, right), dilations (2), group, output channels
enum Spec : int { kBlock = 0, kKernel = 1, kStride = 3, kPads = 5, kDilation = 9, kGroup = 11, kOutChannels = 12,
                  kSpecLength = 13 };

// the output's size along spatial axis ``axis`` (0: rows, 1: columns) for an input of ``in``
int64_t output_size(int64_t in, at::IntArrayRef spec, int axis) {
  return (in + spec[kPads + axis] + spec[kPads + 2 + axis] - spec[kDilation + axis] * (spec[kKernel + axis] - 1) - 1) /
             spec[kStride + axis] + 1;
}

const NchwcConv& nchwc_for(const at::Tensor& w, const at::Tensor& b, bool sum, at::IntArrayRef spec,
                           at::ArrayRef<double> activation, int64_t unit, int64_t slot) {
  std::lock_guard<std::mutex> guard(lock);
  TORCH_CHECK(runtime, "korch_ort: ONNX Runtime's library is not open (korch.backends.ort_gemm opens it)");
  auto found = nchwc_convs.find({unit, slot});
  if (found == nchwc_convs.end()) {
    // the one-Conv model of output blocks [first, last), serialized by korch in Python (backends/nchwc.py)
    static auto model_of = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("korch::ort_nchwc_model", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, bool, at::IntArrayRef,
                                                 at::ArrayRef<double>, int64_t, int64_t)>();
    const int64_t block = spec[kBlock], out_blocks = (spec[kOutChannels] + block - 1) / block;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), out_blocks));
    NchwcConv conv{std::vector<OrtSession*>(parts), out_blocks};
    for (int64_t p = 0; p < parts; ++p) {
      conv.sessions[p] = runtime->open(model_of.call(w, b, sum, spec, activation, conv.first_block(p),
                                                     conv.first_block(p + 1)));
    }
    found = nchwc_convs.emplace(std::make_pair(unit, slot), std::move(conv)).first;
  }
  return found->second;
}

// x: (N, C/B, H, W, B) blocked, or (N, C, H, W) with C < B (a network's first convolution: MLAS reads it so);
// sum: a blocked value of the output's shape added before the activation (a residual connection), or none
at::Tensor nchwc_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                      const std::optional<at::Tensor>& sum, at::IntArrayRef spec, at::ArrayRef<double> activation,
                      int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && (x.dim() == 5 || x.dim() == 4) && spec.size() == kSpecLength,
              "korch_ort::nchwc_conv takes a float32 blocked (5-D) or NCHW (4-D) array, got ", x.sizes());
  const int64_t block = spec[kBlock];
  TORCH_CHECK(x.dim() == 4 || x.size(4) == block, "korch_ort::nchwc_conv: blocks of ", x.size(4), " channels, ",
              "the unit was built for ", block);
  at::Tensor input = x.contiguous();
  const NchwcConv& conv = nchwc_for(w, b, sum.has_value(), spec, activation, unit, slot);
  const int64_t n = x.size(0), h = x.size(2), wd = x.size(3);
  const int64_t in_channels = x.dim() == 5 ? x.size(1) * block : x.size(1);
  const int64_t ho = output_size(h, spec, 0), wo = output_size(wd, spec, 1);
  const bool depthwise = spec[kGroup] > 1;
  at::Tensor out = at::empty({n, conv.out_blocks, ho, wo, block}, x.options());
  float *x_data = input.data_ptr<float>(), *y_data = out.data_ptr<float>();
  at::Tensor added = sum.has_value() ? sum->contiguous() : at::Tensor();
  TORCH_CHECK(!added.defined() || added.sizes() == out.sizes(), "korch_ort::nchwc_conv: a sum of shape ",
              added.sizes(), " for an output of ", out.sizes());
  float* sum_data = added.defined() ? added.data_ptr<float>() : nullptr;
  const int64_t in_image = in_channels * h * wd, out_image = conv.out_blocks * block * ho * wo;
  const int64_t parts = conv.sessions.size();
  at::parallel_for(0, parts * n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t p = item % parts, image = item / parts;
      const int64_t first = conv.first_block(p), blocks = conv.first_block(p + 1) - first;
      // a depthwise part reads only its own channels
      float* source = x_data + image * in_image + (depthwise ? first * block * h * wd : 0);
      const int64_t channels = depthwise ? blocks * block : in_channels;
      const int64_t at = image * out_image + first * block * ho * wo;
      std::vector<Array> inputs{{source, {1, channels, h, wd}}};
      if (sum_data != nullptr) inputs.push_back({sum_data + at, {1, blocks * block, ho, wo}});
      runtime->run(conv.sessions[p], inputs, {y_data + at, {1, blocks * block, ho, wo}});
    }
  });
  return out;
}

// x: (N, C, H, W); w: (C, KH, KW, C_out); spec: stride, then the pads (top, left, bottom, right); activation
// (korch_direct::Activation) after the bias. The output: (N, OH, OW, C_out), channels-last.
at::Tensor direct_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::IntArrayRef spec,
                       int64_t activation) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 4 && w.dim() == 4 && spec.size() == 5 &&
                  w.size(0) == x.size(1) && b.numel() == w.size(3),
              "korch_ort::direct_conv takes a float32 NCHW array and a (C, KH, KW, C_out) weight, got ", x.sizes(),
              " and ", w.sizes());
  const int stride = static_cast<int>(spec[0]);
  TORCH_CHECK(korch_direct::supported(stride, static_cast<int>(w.size(2)), w.size(3)),
              "korch_ort::direct_conv: no kernel for stride ", stride, " and weight ", w.sizes());
  at::Tensor input = x.contiguous(), weight = w.contiguous(), bias = b.contiguous();
  korch_direct::Shape s{x.size(0), x.size(1), x.size(2), x.size(3), 0, 0, w.size(3), static_cast<int>(w.size(1)),
                        static_cast<int>(w.size(2)), stride, static_cast<int>(spec[1]), static_cast<int>(spec[2]),
                        static_cast<int>(activation)};
  s.oh = (s.h + spec[1] + spec[3] - s.kh) / stride + 1;
  s.ow = (s.w + spec[2] + spec[4] - s.kw) / stride + 1;
  at::Tensor out = at::empty({s.n, s.oh, s.ow, s.cout}, x.options());
  korch_direct::run(input.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                    out.data_ptr<float>(), s);
  return out;
}

}  // namespace

// native.py names the namespace after this source (one library per namespace and process)
#ifndef KORCH_NAMESPACE
#define KORCH_NAMESPACE korch_ort
#endif
// one more macro level, so that KORCH_NAMESPACE expands before TORCH_LIBRARY pastes it
#define KORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define KORCH_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

KORCH_LIBRARY(KORCH_NAMESPACE, m) {
  m.def("open_runtime(str library) -> ()", &open_runtime);
  m.def("close_unit(int unit) -> ()", &close_unit);
  m.def("matmul(Tensor x, Tensor w, int unit, int slot) -> Tensor");
  m.def("matmul_blocks(Tensor x, Tensor w, int unit, int slot, int blocks) -> Tensor");
  m.def("batched_matmul(Tensor a, Tensor b, int unit, int slot) -> Tensor");
  m.def("softmax(Tensor x, int unit, int slot) -> Tensor");
  m.def("mkl_matmul(Tensor x, Tensor w, int unit, int slot) -> Tensor");
  m.def("nchwc_conv(Tensor x, Tensor w, Tensor b, Tensor? sum, int[] spec, float[] activation, int unit, int slot) "
        "-> Tensor");
  m.def("direct_conv(Tensor x, Tensor w, Tensor b, int[] spec, int activation) -> Tensor");
}

KORCH_LIBRARY_IMPL(KORCH_NAMESPACE, CPU, m) {
  m.impl("matmul", &matmul);
  m.impl("matmul_blocks", &matmul_blocks);
  m.impl("batched_matmul", &batched_matmul);
  m.impl("softmax", &softmax);
  m.impl("mkl_matmul", &mkl_matmul);
  m.impl("nchwc_conv", &nchwc_conv);
  m.impl("direct_conv", &direct_conv);
}
