// korch_ort::matmul: a product by a constant weight, computed by ONNX Runtime's MLAS, called from a compiled
// unit with no Python in between (backends/ort_gemm.py builds and loads this file).
//
// Each weight gets one-MatMul ONNX Runtime sessions with one intra-op thread each (MLAS packs the weight
// once, when a session opens), run on torch's own threads (at::parallel_for): ONNX Runtime's thread pools
// never start, so MLAS never waits for cores that torch's OpenMP workers hold. A small weight (at most
// kRowSplitBytes) multiplied by enough rows has one session and the threads split the rows. A larger one,
// or one first called with too few rows to split (one token of a decoder), is cut into column blocks, a
// session each, and each thread multiplies every row by its block, so that it streams its share of the
// weight, not all of it (rows split made both threads read the whole weight: 4% slower on ViT's
// 197x768x3072 product), at the cost of copying its block of the result into place.
//
// ONNX Runtime's C API is a table of function pointers whose order its authors never change (struct OrtApi in
// onnxruntime_c_api.h; the wheel ships the library, not the header): korch names the slots it calls.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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

struct OrtApiBase {
  const void* const* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
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
    auto create = call<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
        kCreateTensorWithDataAsOrtValue);
    auto release = call<void (*)(OrtValue*)>(kReleaseValue);
    const int64_t x_shape[2] = {rows, k}, y_shape[2] = {rows, n};
    OrtValue *input = nullptr, *output = nullptr;
    check(create(cpu_, x, rows * k * sizeof(float), x_shape, 2, kFloat, &input));
    std::unique_ptr<OrtValue, void (*)(OrtValue*)> owned_input(input, release);
    check(create(cpu_, y, rows * n * sizeof(float), y_shape, 2, kFloat, &output));
    std::unique_ptr<OrtValue, void (*)(OrtValue*)> owned_output(output, release);
    const char* input_name = "x";
    const char* output_name = "y";
    check(call<OrtStatus* (*)(OrtSession*, const void*, const char* const*, const OrtValue* const*, size_t,
                              const char* const*, size_t, OrtValue**)>(kRun)(session, nullptr, &input_name, &input,
                                                                              1, &output_name, 1, &output));
  }

 private:
  void* handle_ = nullptr;
  const void* const* api_ = nullptr;
  OrtEnv* env_ = nullptr;
  OrtMemoryInfo* cpu_ = nullptr;
};

struct Gemm {
  std::vector<OrtSession*> sessions;  // one (rows split), or one per column block
  int64_t k, n;

  // block b's first column (b = blocks: n): the blocks cut n as evenly as integers allow
  int64_t start(int64_t b) const { return n * b / static_cast<int64_t>(sessions.size()); }
};

std::mutex lock;
std::unique_ptr<Runtime> runtime;
// (unit token, slot) -> its sessions, which live as long as the process
std::map<std::pair<int64_t, int64_t>, Gemm> gemms;

void open_runtime(c10::string_view library) {
  std::lock_guard<std::mutex> guard(lock);
  if (!runtime) runtime = std::make_unique<Runtime>(std::string(library));
}

// the slot's sessions, opened on its first call (``rows``: that call's row count)
const Gemm& gemm_for(const at::Tensor& w, int64_t unit, int64_t slot, int64_t rows) {
  std::lock_guard<std::mutex> guard(lock);
  TORCH_CHECK(runtime, "korch_ort: ONNX Runtime's library is not open (korch.backends.ort_gemm opens it)");
  auto found = gemms.find({unit, slot});
  if (found == gemms.end()) {
    // the one-MatMul model holding a block of this weight, serialized by korch in Python (backends/ort_gemm.py)
    static auto model_of = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("korch::ort_gemm_model", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    const int64_t n = w.size(1);
    const bool split_rows = w.numel() * 4 <= kRowSplitBytes && rows >= 2 * kMinRows;
    const int64_t blocks =
        split_rows ? 1 : std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / kMinColumnsPerBlock));
    Gemm gemm{std::vector<OrtSession*>(blocks), w.size(0), n};
    for (int64_t b = 0; b < blocks; ++b) {
      at::Tensor block = w.narrow(1, gemm.start(b), gemm.start(b + 1) - gemm.start(b)).contiguous();
      gemm.sessions[b] = runtime->open(model_of.call(block));
    }
    found = gemms.emplace(std::make_pair(unit, slot), std::move(gemm)).first;
  }
  TORCH_CHECK(found->second.k == w.size(0) && found->second.n == w.size(1), "korch_ort: unit ", unit, " slot ",
              slot, " was opened for a ", found->second.k, "x", found->second.n, " weight, called with ", w.size(0),
              "x", w.size(1));
  return found->second;
}

at::Tensor matmul(const at::Tensor& x, const at::Tensor& w, int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2,
              "korch_ort::matmul multiplies float32 rows by a float32 matrix");
  at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
  const Gemm& gemm = gemm_for(w, unit, slot, rows.size(0));
  const int64_t m = rows.size(0), k = gemm.k, n = gemm.n;
  const int64_t blocks = static_cast<int64_t>(gemm.sessions.size());
  at::Tensor out = at::empty({m, n}, x.options());
  float* x_data = rows.data_ptr<float>();
  if (blocks == 1) {
    float* y_data = out.data_ptr<float>();
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), m / kMinRows));
    at::parallel_for(0, m, (m + threads - 1) / threads, [&](int64_t begin, int64_t end) {
      runtime->run(gemm.sessions[0], x_data + begin * k, y_data + begin * n, end - begin, k, n);
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
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY(korch_ort, m) {
  m.def("open_runtime(str library) -> ()", &open_runtime);
  m.def("matmul(Tensor x, Tensor w, int unit, int slot) -> Tensor");
}

TORCH_LIBRARY_IMPL(korch_ort, CPU, m) { m.impl("matmul", &matmul); }
