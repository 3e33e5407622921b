// pinwheel-selftest: the checks a V100 owner runs before trusting a box.
//
//  * pwst_gemm: an fp16 GEMM on the SM70 tensor cores (mma.sync.aligned.m8n8k4,
//    fp32 accumulate), compared with an exact host reference. A GLM-5.3 V100
//    build once hit an fp16 dot that silently returned wrong rows on SM70; this
//    names the rows.
//  * pwst_p2p: fill a buffer on one GPU, copy it to another (cudaMemcpyPeer and
//    a kernel reading peer memory directly), checksum all copies on the GPUs and
//    on the host, so silent P2P corruption shows up as a checksum mismatch.
//  * pwst_launch_count: launches a kernel of csrc/launches.cu (internal linkage) and
//    returns how many runs the device counted.
//
// The C API below is all the Python side uses (ctypes): no torch needed. The
// CUDA runtime is linked statically, so only the driver (libcuda.so.1) is
// required at run time. Built with compute_70 PTX as well as sm_70 SASS, the
// same library runs on newer GPUs through the driver's JIT.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PWST_API extern "C" __attribute__((visibility("default")))

// ----------------------------------------------------------------------------- kernels

// One quadpair (lanes 4q..4q+3 and 4q+16..4q+19) computes one 8x8 tile of C;
// a warp computes four. A is MxK row-major, Bt is NxK row-major (B column-major).
__global__ void pwst_mma_gemm(const __half* A, const __half* Bt, float* C, int M, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int tiles_n = N / 8, tiles = (M / 8) * tiles_n;
  int tile = warp * 4 + ((lane >> 2) & 3);
  const bool live = tile < tiles;
  if (!live) tile = 0;  // every lane of the warp must reach mma.sync
  const int tm = tile / tiles_n, tn = tile % tiles_n;
  // The A row / B column this lane feeds: lane bits 0-1, plus 4 for lanes 16-31.
  const int rc = (lane & 3) + 4 * ((lane >> 4) & 1);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const __half* a_row = A + (size_t)(tm * 8 + rc) * K;
  const __half* b_col = Bt + (size_t)(tn * 8 + rc) * K;
  for (int k0 = 0; k0 < K; k0 += 4) {
    const uint2 a = *reinterpret_cast<const uint2*>(a_row + k0);
    const uint2 b = *reinterpret_cast<const uint2*>(b_col + k0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),
          "+f"(acc[6]), "+f"(acc[7])
        : "r"(a.x), "r"(a.y), "r"(b.x), "r"(b.y));
#endif
  }
  if (!live) return;
  // fp32 accumulator layout of m8n8k4 (PTX ISA): row and column of register i.
  for (int i = 0; i < 8; ++i) {
    const int m = (lane & 1) + (i & 2) + 4 * ((lane >> 4) & 1);
    const int n = (i & 1) + (lane & 2) + (i & 4);
    C[(size_t)(tm * 8 + m) * N + tn * 8 + n] = acc[i];
  }
}

__host__ __device__ static inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Position-dependent so that swapped or shifted words change the sum too.
__host__ __device__ static inline uint64_t word_mix(uint32_t word, uint64_t index) {
  return splitmix64(((uint64_t)word << 32) ^ index);
}

__global__ void pwst_fill(uint32_t* buf, uint64_t words, uint64_t seed) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
       i += (uint64_t)gridDim.x * blockDim.x)
    buf[i] = (uint32_t)splitmix64(seed + i);
}

__global__ void pwst_copy(const uint32_t* __restrict__ src, uint32_t* __restrict__ dst,
                          uint64_t words) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
       i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void pwst_checksum(const uint32_t* buf, uint64_t words, unsigned long long* out) {
  unsigned long long sum = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
       i += (uint64_t)gridDim.x * blockDim.x)
    sum += word_mix(buf[i], i);
  atomicAdd(out, sum);  // addition mod 2^64 commutes: the order of blocks does not matter
}

// ----------------------------------------------------------------------------- host helpers

static int fail(char* err, size_t len, const char* what, cudaError_t rc) {
  if (err && len) snprintf(err, len, "%s: %s (%s)", what, cudaGetErrorString(rc), cudaGetErrorName(rc));
  return (int)rc ? (int)rc : -1;
}

// The failing call and where it is (file:line, as every CUDA error macro reports it):
// __FILE__ is the path the compiler was given, so it must be the canonical one.
#define PWST_STR2(x) #x
#define PWST_STR(x) PWST_STR2(x)
#define CHECK(call)                                        \
  do {                                                     \
    cudaError_t rc_ = (call);                              \
    if (rc_ != cudaSuccess)                                \
      return fail(err, errlen, #call " at " __FILE__ ":" PWST_STR(__LINE__), rc_); \
  } while (0)

// Exact fp32 -> fp16 bits for the values used here (multiples of 1/8 in [-1, 1]).
static uint16_t to_half_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if ((x & 0x7fffffffu) == 0) return (uint16_t)sign;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x >> 13) & 0x3ffu));
}

static float operand(uint64_t seed, uint64_t index) {
  return (float)((int)(splitmix64(seed ^ index) % 17) - 8) / 8.0f;  // k/8, k in -8..8: exact in fp16
}

// ----------------------------------------------------------------------------- C API

PWST_API int pwst_device_count(int* count, char* err, size_t errlen) {
  CHECK(cudaGetDeviceCount(count));
  return 0;
}

PWST_API int pwst_device_info(int dev, char* name, size_t namelen, int* major, int* minor,
                              int* driver, char* err, size_t errlen) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  snprintf(name, namelen, "%s", prop.name);
  *major = prop.major;
  *minor = prop.minor;
  CHECK(cudaDriverGetVersion(driver));
  return 0;
}

// Runs C = A·B on device ``dev`` with the tensor cores; compares with the host.
// The operands are multiples of 1/8, so every product and sum is exact in fp32:
// any difference is a wrong result, not rounding.
PWST_API int pwst_gemm(int dev, int M, int N, int K, double* max_abs_err, int* wrong_rows,
                       int* first_wrong_row, int* binary_version, int* ptx_version, char* err,
                       size_t errlen) {
  if (M % 8 || N % 8 || K % 4 || M <= 0 || N <= 0 || K <= 0) {
    snprintf(err, errlen, "shape %dx%dx%d: M and N must be multiples of 8, K of 4", M, N, K);
    return -1;
  }
  CHECK(cudaSetDevice(dev));
  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, pwst_mma_gemm));
  *binary_version = attr.binaryVersion;  // 70: SASS from the wheel; higher: JIT from PTX
  *ptx_version = attr.ptxVersion;
  const size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
  uint16_t* ha = (uint16_t*)malloc(na * 2);
  uint16_t* hb = (uint16_t*)malloc(nb * 2);
  float* fa = (float*)malloc(na * 4);
  float* fb = (float*)malloc(nb * 4);
  float* hc = (float*)malloc(nc * 4);
  for (size_t i = 0; i < na; ++i) ha[i] = to_half_bits(fa[i] = operand(0xA11CEull, i));
  for (size_t i = 0; i < nb; ++i) hb[i] = to_half_bits(fb[i] = operand(0xB0Bull, i));
  __half *da, *db;
  float* dc;
  cudaError_t rc = cudaMalloc(&da, na * 2);
  if (rc == cudaSuccess) rc = cudaMalloc(&db, nb * 2);
  if (rc == cudaSuccess) rc = cudaMalloc(&dc, nc * 4);
  if (rc == cudaSuccess) rc = cudaMemcpy(da, ha, na * 2, cudaMemcpyHostToDevice);
  if (rc == cudaSuccess) rc = cudaMemcpy(db, hb, nb * 2, cudaMemcpyHostToDevice);
  if (rc == cudaSuccess) rc = cudaMemset(dc, 0xff, nc * 4);  // NaN: unwritten cells show up
  if (rc == cudaSuccess) {
    const int tiles = (M / 8) * (N / 8), warps = (tiles + 3) / 4, per_block = 4;
    pwst_mma_gemm<<<(warps + per_block - 1) / per_block, per_block * 32>>>(da, db, dc, M, N, K);
    rc = cudaGetLastError();
  }
  if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
  if (rc == cudaSuccess) rc = cudaMemcpy(hc, dc, nc * 4, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (rc == cudaSuccess) {
    double worst = 0.0;
    int bad = 0, first = -1;
    for (int m = 0; m < M; ++m) {
      int row_bad = 0;
      for (int n = 0; n < N; ++n) {
        double ref = 0.0;
        for (int k = 0; k < K; ++k) ref += (double)fa[(size_t)m * K + k] * fb[(size_t)n * K + k];
        const double got = hc[(size_t)m * N + n];
        const double diff = isnan(got) ? INFINITY : fabs(got - ref);
        if (diff > worst) worst = diff;
        if (diff > 0.0) row_bad = 1;
      }
      if (row_bad && first < 0) first = m;
      bad += row_bad;
    }
    *max_abs_err = worst;
    *wrong_rows = bad;
    *first_wrong_row = first;
  }
  free(ha);
  free(hb);
  free(fa);
  free(fb);
  free(hc);
  if (rc != cudaSuccess) return fail(err, errlen, "gemm", rc);
  return 0;
}

static int device_sum(const uint32_t* buf, uint64_t words, uint64_t* out, char* err, size_t errlen) {
  unsigned long long* d;
  CHECK(cudaMalloc(&d, sizeof *d));
  CHECK(cudaMemset(d, 0, sizeof *d));
  pwst_checksum<<<256, 256>>>(buf, words, d);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(out, d, sizeof *d, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  return 0;
}

// csrc/launches.cu: a unit whose only external definition is this instantiation.
template <int Threads>
cudaError_t pwst_count_launches(int runs, unsigned int* count);
extern template cudaError_t pwst_count_launches<1>(int runs, unsigned int* count);

// *count: how many of `runs` one-thread launches of a kernel in another unit the device
// counted (`runs` when the driver loaded and ran that unit's module).
PWST_API int pwst_launch_count(int device, int runs, unsigned int* count, char* err,
                               size_t errlen) {
  CHECK(cudaSetDevice(device));
  CHECK(pwst_count_launches<1>(runs, count));
  return 0;
}

// sums[0] expected (host), [1] on src, [2] on dst after cudaMemcpyPeer,
// [3] on dst after a kernel on dst read src's memory over P2P (only when
// *peer_access is set: the GPUs can address each other, or src == dst).
PWST_API int pwst_p2p(int src, int dst, uint64_t nbytes, uint64_t seed, uint64_t sums[4],
                      int* peer_access, char* err, size_t errlen) {
  const uint64_t words = nbytes / 4;
  if (words == 0) {
    snprintf(err, errlen, "nbytes %llu: need at least 4", (unsigned long long)nbytes);
    return -1;
  }
  uint64_t expected = 0;
  for (uint64_t i = 0; i < words; ++i) expected += word_mix((uint32_t)splitmix64(seed + i), i);
  sums[0] = expected;
  int can = src == dst;
  if (!can) CHECK(cudaDeviceCanAccessPeer(&can, dst, src));
  *peer_access = can;

  uint32_t *a, *b, *c = NULL;
  CHECK(cudaSetDevice(src));
  CHECK(cudaMalloc(&a, words * 4));
  pwst_fill<<<256, 256>>>(a, words, seed);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (device_sum(a, words, &sums[1], err, errlen)) return -1;

  CHECK(cudaSetDevice(dst));
  CHECK(cudaMalloc(&b, words * 4));
  CHECK(cudaMemcpyPeer(b, dst, a, src, words * 4));
  CHECK(cudaDeviceSynchronize());
  if (device_sum(b, words, &sums[2], err, errlen)) return -1;

  sums[3] = 0;
  if (can) {
    if (src != dst) {
      cudaError_t rc = cudaDeviceEnablePeerAccess(src, 0);
      if (rc == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else if (rc != cudaSuccess) return fail(err, errlen, "cudaDeviceEnablePeerAccess", rc);
    }
    CHECK(cudaMalloc(&c, words * 4));
    pwst_copy<<<256, 256>>>(a, c, words);  // dst's SMs load src's memory directly
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    if (device_sum(c, words, &sums[3], err, errlen)) return -1;
    CHECK(cudaFree(c));
  }
  CHECK(cudaFree(b));
  CHECK(cudaSetDevice(src));
  CHECK(cudaFree(a));
  return 0;
}
