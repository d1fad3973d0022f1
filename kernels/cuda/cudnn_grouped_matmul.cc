#include "kernels/cuda/cudnn_grouped_matmul.h"

#include <array>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#ifdef MOELAB_HAVE_CUDNN
#include <cudnn.h>
#include <dlfcn.h>

#include <type_traits>
#endif

namespace moelab::cuda {

namespace {
// The first cuDNN that runs the MoE grouped matmul: its support matrix (docs, "MoE Grouped Matmul")
// and cudnn-frontend's own tests (test_moe_grouped_matmul.py skips below 91800) say 9.18; the
// operation's enums appeared in 9.15's headers, before the engines.
constexpr size_t kMinVersion = 91800;
}  // namespace

bool CudnnVersionHasGroupedMatmul(size_t version, std::string* why) {
  if (version >= kMinVersion) return true;
  if (why) {
    *why = "cuDNN " + std::to_string(version) +
           " is loaded; the MoE grouped matmul needs 9.18 or later";
  }
  return false;
}

#ifndef MOELAB_HAVE_CUDNN

bool CudnnGroupedMatmulAvailable(std::string* why) {
  if (why) *why = "this build has no cuDNN (cudnn.h was not found at configure time)";
  return false;
}
size_t CudnnVersion() { return 0; }
struct CudnnGroupedMatmul::Impl {};
CudnnGroupedMatmul::CudnnGroupedMatmul(const GroupedMatmulShape& shape) : shape_(shape) {
  throw std::invalid_argument("cuDNN grouped matmul: this build has no cuDNN");
}
CudnnGroupedMatmul::~CudnnGroupedMatmul() = default;
void CudnnGroupedMatmul::Run(const bf16*, const bf16*, const int32_t*, bf16*, cudaStream_t) {}
int64_t CudnnGroupedMatmul::EnginesProposed(const std::string&) const { return 0; }

#else

namespace {

// cuDNN is loaded at run time (dlopen), not linked: the binaries start, and every other path
// runs, on a machine whose libraries lack it (the GPU machine's venv may have no cuDNN wheel);
// only this path is then refused, naming what is missing. The functions used here, resolved
// once per process from libcudnn.so.9 (its graph API forwards to libcudnn_graph).
struct CudnnApi {
  decltype(&cudnnBackendCreateDescriptor) BackendCreateDescriptor;
  decltype(&cudnnBackendDestroyDescriptor) BackendDestroyDescriptor;
  decltype(&cudnnBackendExecute) BackendExecute;
  decltype(&cudnnBackendFinalize) BackendFinalize;
  decltype(&cudnnBackendGetAttribute) BackendGetAttribute;
  decltype(&cudnnBackendSetAttribute) BackendSetAttribute;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnGetLastErrorString) GetLastErrorString;
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnSetStream) SetStream;
};

constexpr const char* kCudnnLibrary = "libcudnn.so.9";

// The loaded API, or null with *why naming the library or the symbol that is missing.
const CudnnApi* LoadCudnn(std::string* why) {
  struct Loaded {
    CudnnApi api{};
    std::string error;  // "" when every symbol resolved
  };
  static const Loaded loaded = [] {
    Loaded l;
    void* lib = dlopen(kCudnnLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      l.error = std::string("cannot load ") + kCudnnLibrary + " (" + (e ? e : "dlopen failed") +
                "): put cuDNN 9.18+ on the library path (the venv's nvidia/cudnn/lib)";
      return l;
    }
    auto resolve = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)> >(dlsym(lib, name));
      if (fn == nullptr && l.error.empty()) {
        l.error = std::string(kCudnnLibrary) + " has no " + name + " (too old a cuDNN)";
      }
    };
    resolve(l.api.BackendCreateDescriptor, "cudnnBackendCreateDescriptor");
    resolve(l.api.BackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
    resolve(l.api.BackendExecute, "cudnnBackendExecute");
    resolve(l.api.BackendFinalize, "cudnnBackendFinalize");
    resolve(l.api.BackendGetAttribute, "cudnnBackendGetAttribute");
    resolve(l.api.BackendSetAttribute, "cudnnBackendSetAttribute");
    resolve(l.api.Create, "cudnnCreate");
    resolve(l.api.GetErrorString, "cudnnGetErrorString");
    resolve(l.api.GetLastErrorString, "cudnnGetLastErrorString");
    resolve(l.api.GetVersion, "cudnnGetVersion");
    resolve(l.api.SetStream, "cudnnSetStream");
    return l;
  }();
  if (!loaded.error.empty()) {
    if (why) *why = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

// The API for code that runs only once LoadCudnn succeeded (CudnnGroupedMatmul is built only
// then); throws naming what is missing otherwise.
const CudnnApi& Dnn() {
  std::string why;
  const CudnnApi* api = LoadCudnn(&why);
  if (api == nullptr) throw std::invalid_argument("cuDNN grouped matmul: " + why);
  return *api;
}

std::string Status(cudnnStatus_t s) {
  char detail[512] = {0};
  Dnn().GetLastErrorString(detail, sizeof(detail));
  std::string out = Dnn().GetErrorString(s);
  if (detail[0]) out += std::string(" (") + detail + ")";
  return out;
}

void Check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + Status(s));
}
#define MOELAB_CUDNN(call) Check((call), #call)

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    MOELAB_CUDNN(Dnn().BackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_) Dnn().BackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* address() { return &d_; }

  template <typename V>
  void Set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const V* values) {
    MOELAB_CUDNN(Dnn().BackendSetAttribute(d_, name, type, count, values));
  }
  void Set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    cudnnBackendDescriptor_t v = value.get();
    Set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  // Finalize, or throw std::invalid_argument naming `what` and cuDNN's reason.
  void Finalize(const std::string& what) {
    const cudnnStatus_t s = Dnn().BackendFinalize(d_);
    if (s != CUDNN_STATUS_SUCCESS) {
      throw std::invalid_argument("cuDNN grouped matmul: " + what + " refused: " + Status(s));
    }
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A 3-d tensor descriptor; uid names it in the variant pack.
Descriptor Tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 3> dims,
                  std::array<int64_t, 3> strides) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  t.Set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.Set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 3, dims.data());
  t.Set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, strides.data());
  t.Set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.Set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  t.Finalize("tensor " + std::to_string(uid));
  return t;
}

enum Uid : int64_t { kToken = 1, kWeight, kFirstRow, kOutput };

// The calling thread's cuDNN handle (created on first use; like Cublas, one per thread).
cudnnHandle_t Handle(cudaStream_t stream) {
  thread_local cudnnHandle_t handle = nullptr;
  if (!handle) MOELAB_CUDNN(Dnn().Create(&handle));
  MOELAB_CUDNN(Dnn().SetStream(handle, stream));
  return handle;
}

}  // namespace

bool CudnnGroupedMatmulAvailable(std::string* why) {
  const CudnnApi* api = LoadCudnn(why);
  return api != nullptr && CudnnVersionHasGroupedMatmul(api->GetVersion(), why) &&
         CudaAvailable(why);
}

size_t CudnnVersion() {
  const CudnnApi* api = LoadCudnn(nullptr);
  return api ? api->GetVersion() : 0;
}

struct CudnnGroupedMatmul::Impl {
  Descriptor token, weight, first_row, output, op;
  // Built on the first Run (they need a handle); the chosen engine configuration is kept with
  // the plan made from it.
  std::unique_ptr<Descriptor> graph, config, plan;
  DeviceBuffer<unsigned char> workspace;

  // The weights as cuDNN's MoE engines take them (B_e [k, n] "ColumnMajor": k contiguous), which
  // is W [E, n, k] as the model stores a projection.
  explicit Impl(const GroupedMatmulShape& s)
      : token(Tensor(kToken, CUDNN_DATA_BFLOAT16, {1, s.rows, s.k}, {s.rows * s.k, s.k, 1})),
        weight(Tensor(kWeight, CUDNN_DATA_BFLOAT16, {s.experts, s.k, s.n},
                      {int64_t(s.n) * s.k, 1, s.k})),
        first_row(Tensor(kFirstRow, CUDNN_DATA_INT32, {s.experts, 1, 1}, {1, 1, 1})),
        output(Tensor(kOutput, CUDNN_DATA_BFLOAT16, {1, s.rows, s.n}, {s.rows * s.n, s.n, 1})),
        op(CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR) {
    const cudnnMoeGroupedMatmulMode_t mode = CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
    const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, 1,
           &mode);
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &accumulate);
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, token);
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, weight);
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, first_row);
    op.Set(CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, output);
    op.Finalize("the operation");
  }

  // The operation graph of op, for the device of `handle`; without one (null) for a device that
  // the heuristics are given as properties (EnginesProposed).
  Descriptor Graph(cudnnHandle_t handle) const {
    Descriptor g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnBackendDescriptor_t ops = op.get();
    g.Set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ops);
    if (handle) g.Set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g.Finalize("the operation graph");
    return g;
  }

  // The engine configurations cuDNN's heuristics propose for `graph` in `mode`, on `device` when
  // given (else the graph's handle's); none where they refuse the graph.
  static std::vector<Descriptor> Proposals(const Descriptor& graph, cudnnBackendHeurMode_t mode,
                                           const Descriptor* device) {
    std::vector<Descriptor> configs;
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.Set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heuristics.Set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (device) heuristics.Set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device);
    if (Dnn().BackendFinalize(heuristics.get()) != CUDNN_STATUS_SUCCESS) return configs;
    int64_t count = 0;
    MOELAB_CUDNN(Dnn().BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t returned = 0;
    if (count > 0) {
      MOELAB_CUDNN(Dnn().BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                             raw.data()));
    }
    while (static_cast<int64_t>(configs.size()) > returned) configs.pop_back();
    return configs;
  }

  // The operation graph, then the first engine configuration of cuDNN's heuristics (mode A, else
  // the fallback list) whose execution plan finalizes, and its workspace.
  void BuildPlan(cudnnHandle_t handle) {
    graph = std::make_unique<Descriptor>(Graph(handle));
    std::string refusals;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      std::vector<Descriptor> configs = Proposals(*graph, mode, nullptr);
      refusals += mode == CUDNN_HEUR_MODE_A ? " mode A: " : "; fallback: ";
      refusals += std::to_string(configs.size()) + " proposed";
      for (size_t i = 0; i < configs.size() && !plan; ++i) {
        auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        candidate->Set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        candidate->Set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
        const cudnnStatus_t s = Dnn().BackendFinalize(candidate->get());
        if (s == CUDNN_STATUS_SUCCESS) {
          config = std::make_unique<Descriptor>(std::move(configs[i]));
          plan = std::move(candidate);
        } else {
          refusals += " [" + std::to_string(i) + "] " + Status(s);
        }
      }
      if (plan) break;
    }
    if (!plan) {
      throw std::runtime_error("cuDNN grouped matmul: no engine of cuDNN " +
                               std::to_string(Dnn().GetVersion()) +
                               " takes this shape:" + refusals);
    }
    int64_t bytes = 0, got = 0;
    MOELAB_CUDNN(Dnn().BackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &got, &bytes));
    workspace.Resize(static_cast<size_t>(bytes));
  }
};

namespace {
// What the descriptors promise cuDNN: positive sizes, and every row of every operand on a
// 16-byte boundary (the tensors' byte alignment), so k and n are multiples of 8 bf16.
const GroupedMatmulShape& Checked(const GroupedMatmulShape& s) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("cuDNN grouped matmul: " + why + " (experts " +
                                std::to_string(s.experts) + ", rows " + std::to_string(s.rows) +
                                ", k " + std::to_string(s.k) + ", n " + std::to_string(s.n) + ")");
  };
  if (s.experts < 1 || s.rows < 0 || s.k < 1 || s.n < 1) refuse("sizes must be positive");
  if (s.k % 8 || s.n % 8) refuse("k and n must be multiples of 8 (16-byte rows)");
  if (s.rows > INT32_MAX) refuse("rows must fit the int32 first-row offsets");
  return s;
}
}  // namespace

CudnnGroupedMatmul::CudnnGroupedMatmul(const GroupedMatmulShape& shape)
    : shape_(shape), impl_(std::make_unique<Impl>(Checked(shape))) {}

CudnnGroupedMatmul::~CudnnGroupedMatmul() = default;

void CudnnGroupedMatmul::Run(const bf16* tok, const bf16* w, const int32_t* first_row, bf16* out,
                             cudaStream_t stream) {
  if (shape_.rows == 0) return;
  cudnnHandle_t handle = Handle(stream);
  if (!impl_->plan) impl_->BuildPlan(handle);
  int64_t uids[] = {kToken, kWeight, kFirstRow, kOutput};
  void* pointers[] = {const_cast<bf16*>(tok), const_cast<bf16*>(w), const_cast<int32_t*>(first_row),
                      out};
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.Set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4, uids);
  pack.Set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 4, pointers);
  void* workspace = impl_->workspace.data();
  pack.Set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.Finalize("the variant pack");
  MOELAB_CUDNN(Dnn().BackendExecute(handle, impl_->plan->get(), pack.get()));
}

int64_t CudnnGroupedMatmul::EnginesProposed(const std::string& device_json) const {
  Descriptor device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  device.Set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
             static_cast<int64_t>(device_json.size()) + 1, device_json.c_str());
  device.Finalize("the device properties");
  const Descriptor graph = impl_->Graph(nullptr);
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const size_t proposed = Impl::Proposals(graph, mode, &device).size();
    if (proposed > 0) return static_cast<int64_t>(proposed);
  }
  return 0;
}

#endif  // MOELAB_HAVE_CUDNN

}  // namespace moelab::cuda
