// pinwheel-selftest: a launch counter, in a unit shaped like a kernel library's
// instantiation units (flash-attention's flash_fwd_*_sm70.cu): device code with internal
// linkage (an anonymous namespace) and, as its only external definition, an explicit
// template instantiation. selftest.cu's C API (pwst_launch_count) calls it.
//
// nvcc (12.4 and 13.0 seen) names such a unit's internal entities after its front end's
// process id: cudafe++ derives the unit's module id from a plain external variable or
// routine when there is one, else from its own getpid()
// (`_GLOBAL__N__<hash>_<len>_<file>_cu_<hash>_<pid>`). The names reach the registration
// strings and the cubin. pinwheel runs the front end at one fixed pid (compile/canonical.py),
// so these bytes do not depend on the build's process ids: tests/test_repro_variation.py
// builds this kernel twice under varied pids, hosts, times, umasks, locales and paths.

#include <cuda_runtime.h>

namespace {

__device__ unsigned int launches;

__global__ void bump(unsigned int* out) {
  out[0] = ++launches;
}

}  // namespace

// Runs bump `runs` times on the current device; the count the device saw, or the error.
template <int Threads>
cudaError_t pwst_count_launches(int runs, unsigned int* count) {
  unsigned int* d = nullptr;
  const unsigned int zero = 0;
  cudaError_t rc = cudaMemcpyToSymbol(launches, &zero, sizeof zero);
  if (rc == cudaSuccess) rc = cudaMalloc(&d, sizeof *d);
  for (int i = 0; rc == cudaSuccess && i < runs; ++i) {
    bump<<<1, Threads>>>(d);
    rc = cudaGetLastError();
  }
  if (rc == cudaSuccess) rc = cudaMemcpy(count, d, sizeof *count, cudaMemcpyDeviceToHost);
  if (d) cudaFree(d);
  return rc;
}

template cudaError_t pwst_count_launches<1>(int runs, unsigned int* count);
