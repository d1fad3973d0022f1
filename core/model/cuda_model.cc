#include "core/model/cuda_model.h"

#include <stdexcept>

#include "core/device.h"
#include "core/model/moe.h"

#if MOELAB_HAVE_CUDA
#include "core/cuda_util.h"
#include "core/optim/cuda_optimizer_kernels.h"
#endif

namespace moelab {

namespace {
constexpr const char* kNoForward =
    "the CUDA model's forward/backward is not built yet: it needs the kernels/cuda twins of "
    "kernels/cpu (docs/cuda.md, 'Status')";
}  // namespace

#if MOELAB_HAVE_CUDA

struct CudaModel::Impl {
  explicit Impl(const RunConfig& c) : cfg(c), host(c) {}
  RunConfig cfg;
  Model<float> host;  // layout, initial values, and the host side of transfers
  bool bf16 = false;
  cudautil::DeviceBuffer<float> params, grads, bias;
  cudautil::DeviceBuffer<unsigned char> params_bf16;  // __nv_bfloat16 [num_params] when bf16
  CudaOpProfiler* profiler = nullptr;
};

CudaModel::CudaModel(const RunConfig& config) {
  RequireDevice(config.train);
  impl_ = std::make_unique<Impl>(config);
  Impl& I = *impl_;
  I.bf16 = config.train.effective_precision() == "bf16";
  const size_t n = I.host.num_params();
  I.params.Resize(n);
  I.grads.Resize(n);
  I.bias.Resize(I.host.router_bias().size());
  if (I.bf16) I.params_bf16.Resize(n * 2);
}

CudaModel::~CudaModel() = default;

bool CudaModel::ForwardBackwardAvailable(std::string* why) {
  if (why) *why = kNoForward;
  return false;
}

void CudaModel::Init(uint64_t seed) {
  impl_->host.Init(seed);
  UploadParams(impl_->host.params());
  UploadRouterBias();
}

const std::vector<ParamInfo>& CudaModel::param_infos() const { return impl_->host.param_infos(); }
size_t CudaModel::num_params() const { return impl_->host.num_params(); }
bool CudaModel::bf16() const { return impl_->bf16; }
float* CudaModel::params() { return impl_->params.data(); }
float* CudaModel::grads() { return impl_->grads.data(); }

void CudaModel::DownloadParams(float* host) const {
  impl_->params.Download(host, impl_->params.size());
}

void CudaModel::UploadParams(const float* host) {
  impl_->params.Upload(host, impl_->params.size());
  ParamsChanged();
}

std::vector<float>& CudaModel::router_bias() { return impl_->host.router_bias(); }

void CudaModel::UploadRouterBias() {
  std::vector<float>& b = impl_->host.router_bias();
  if (!b.empty()) impl_->bias.Upload(b.data(), b.size());
}

int CudaModel::moe_layers() const { return impl_->host.moe_layers(); }

double CudaModel::ForwardBackward(const int32_t*, int, StepStats*) {
  throw std::runtime_error(kNoForward);
}

double CudaModel::Forward(const int32_t*, int, StepStats*) { throw std::runtime_error(kNoForward); }

void CudaModel::UpdateRouterBias(const std::vector<int64_t>& counts, double rate) {
  Impl& I = *impl_;
  const int E = I.cfg.moe.experts_total;
  if (counts.size() < static_cast<size_t>(moe_layers()) * E)
    throw std::invalid_argument("UpdateRouterBias: counts has the wrong size");
  for (int mi = 0; mi < moe_layers(); ++mi)
    UpdateSelectionBias(router_bias().data() + static_cast<size_t>(mi) * E,
                        counts.data() + static_cast<size_t>(mi) * E, E, rate);
  UploadRouterBias();
}

void CudaModel::ParamsChanged() {
  Impl& I = *impl_;
  if (!I.bf16) return;
  cudaopt::LaunchToBf16(I.params.data(), I.params_bf16.data(), I.params.size(), nullptr);
  MOELAB_CUDA(cudaGetLastError());
}

void CudaModel::set_profiler(CudaOpProfiler* profiler) { impl_->profiler = profiler; }

#else  // no CUDA in this build: every entry point reports that.

struct CudaModel::Impl {};

CudaModel::CudaModel(const RunConfig& config) {
  RequireDevice(config.train);
  throw std::runtime_error("this moelab was built without CUDA");
}
CudaModel::~CudaModel() = default;
bool CudaModel::ForwardBackwardAvailable(std::string* why) {
  if (why) *why = "this moelab was built without CUDA";
  return false;
}
void CudaModel::Init(uint64_t) {}
const std::vector<ParamInfo>& CudaModel::param_infos() const {
  static const std::vector<ParamInfo> none;
  return none;
}
size_t CudaModel::num_params() const { return 0; }
bool CudaModel::bf16() const { return false; }
float* CudaModel::params() { return nullptr; }
float* CudaModel::grads() { return nullptr; }
void CudaModel::DownloadParams(float*) const {}
void CudaModel::UploadParams(const float*) {}
std::vector<float>& CudaModel::router_bias() {
  static std::vector<float> none;
  return none;
}
void CudaModel::UploadRouterBias() {}
int CudaModel::moe_layers() const { return 0; }
double CudaModel::ForwardBackward(const int32_t*, int, StepStats*) {
  throw std::runtime_error("this moelab was built without CUDA");
}
double CudaModel::Forward(const int32_t*, int, StepStats*) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void CudaModel::UpdateRouterBias(const std::vector<int64_t>&, double) {}
void CudaModel::ParamsChanged() {}
void CudaModel::set_profiler(CudaOpProfiler*) {}

#endif

}  // namespace moelab
