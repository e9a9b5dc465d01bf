// korch_ort::matmul: a product by a constant weight, computed by ONNX Runtime's MLAS, called from a compiled
// unit with no Python in between (backends/ort_gemm.py builds and loads this file).
//
// Each weight gets a one-MatMul ONNX Runtime session with one intra-op thread (MLAS packs the weight once,
// when the session opens). A call splits its rows among torch's own threads (at::parallel_for), and each
// thread runs its rows through the session: ONNX Runtime's thread pools never start, so MLAS never waits for
// cores that torch's OpenMP workers hold.
//
// ONNX Runtime's C API is a table of function pointers whose order its authors never change (struct OrtApi in
// onnxruntime_c_api.h; the wheel ships the library, not the header): korch names the slots it calls.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

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
// rows per thread below which a product runs on the calling thread alone
constexpr int64_t kMinRowsPerThread = 16;

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
  OrtSession* session;
  int64_t k, n;
};

std::mutex lock;
std::unique_ptr<Runtime> runtime;
std::map<std::pair<int64_t, int64_t>, Gemm> gemms;  // (unit token, slot) -> its session; sessions live as long as the process

void open_runtime(c10::string_view library) {
  std::lock_guard<std::mutex> guard(lock);
  if (!runtime) runtime = std::make_unique<Runtime>(std::string(library));
}

const Gemm& gemm_for(const at::Tensor& w, int64_t unit, int64_t slot) {
  std::lock_guard<std::mutex> guard(lock);
  TORCH_CHECK(runtime, "korch_ort: ONNX Runtime's library is not open (korch.backends.ort_gemm opens it)");
  auto found = gemms.find({unit, slot});
  if (found == gemms.end()) {
    // the one-MatMul model holding this weight, serialized by korch in Python (backends/ort_gemm.py)
    static auto model_of = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("korch::ort_gemm_model", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    at::Tensor model = model_of.call(w);
    found = gemms.emplace(std::make_pair(unit, slot), Gemm{runtime->open(model), w.size(0), w.size(1)}).first;
  }
  TORCH_CHECK(found->second.k == w.size(0) && found->second.n == w.size(1), "korch_ort: unit ", unit, " slot ",
              slot, " was opened for a ", found->second.k, "x", found->second.n, " weight, called with ", w.size(0),
              "x", w.size(1));
  return found->second;
}

at::Tensor matmul(const at::Tensor& x, const at::Tensor& w, int64_t unit, int64_t slot) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2,
              "korch_ort::matmul multiplies float32 rows by a float32 matrix");
  const Gemm& gemm = gemm_for(w, unit, slot);
  at::Tensor rows = x.reshape({-1, x.size(-1)}).contiguous();
  const int64_t m = rows.size(0), k = gemm.k, n = gemm.n;
  at::Tensor out = at::empty({m, n}, x.options());
  float* x_data = rows.data_ptr<float>();
  float* y_data = out.data_ptr<float>();
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), m / kMinRowsPerThread));
  at::parallel_for(0, m, (m + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    runtime->run(gemm.session, x_data + begin * k, y_data + begin * n, end - begin, k, n);
  });
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
