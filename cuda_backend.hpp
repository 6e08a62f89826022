/* cuda_backend.hpp - the CUDA device for tinygrad.hpp: the same loop IR, rendered as CUDA C,
   compiled by NVRTC and run through the CUDA driver API. Optional, like the GPU itself.

   Use: include it after tinygrad.hpp, and in the one file that defines TINYGRAD_IMPLEMENTATION
   include it there too, after tinygrad.hpp:

       #define TINYGRAD_IMPLEMENTATION
       #include "tinygrad.hpp"
       #include "cuda_backend.hpp"

   That registers the device "CUDA": TG_DEVICE=CUDA makes it the default, Tensor::to("CUDA")
   and to("CPU") move data. Build with -ldl only: libcuda.so.1 (the driver, CUDA 12 or later)
   and libnvrtc.so are opened with dlopen at first use (TG_CUDA_LIBRARY, TG_NVRTC_LIBRARY:
   other files; make test names tests/cuda_on_cpu.cpp, which carries out their calls on the
   CPU), and a machine without them gets a tg::Error that names the library or call that
   failed.

   How a program runs on the GPU. Each loop nest of the program (a Block of the loop IR, after
   the CPU's passes less its fusion into row loops, but with elementwise nests over the same
   loops joined, and nests over the same rows where a group of threads runs each row:
   fuse_maps) becomes a kernel. Its outer loops, as long as each iteration writes
   its own part of every buffer it writes (the test the CPU's parallel_loops pass uses), become
   one grid of threads; what is inside them runs in each thread in the loop IR's order. A nest
   with few grid items and long reductions, or whose items each walk rows of their own (a layer
   norm's, a softmax's), gives each item a block of threads that split the loops and combine
   their partial results in a fixed tree (a warp, where such rows are many or short; a sum's
   whole tree of partial sums as one loop per segment and one reduction; a thread that adds
   more than 16 float terms carries what each addition lost into the next, a compensated sum,
   so that the error does not grow with the length); a nest without grid
   loops runs as one kernel per statement; a scatter runs a thread per column (with many rows, a
   thread per range of rows and column, into copies added by a second kernel); a sum of each of
   few columns over many rows (a bias's gradient) runs a thread per range of rows and column; a
   matrix product runs a block per tile of outputs through shared memory (on tensor cores, its
   operands rounded to TF32, where TG_CUDA_TF32=1), and where its tiles are few and its sums
   long, a block per tile and range of terms; of a split sum's ranges, the last of each output
   to finish adds them in order. Consecutive kernels that touch apart what the others write run
   side by side as one kernel, each on its own range of blocks (an optimizer's updates, a
   product's gradients). Every order is fixed by the shapes, so results are the same on every
   run. From its second run a program is one CUDA graph of its kernels (TG_CUDA_GRAPHS=0: not;
   TG_CUDA_PROFILE=1: not, each kernel timed).
   Bounds checks write the failing site into a small device buffer, which is read back after
   the program; a nest that writes in place starts by looking at it, so a failed check still
   prevents the program's in-place writes. TG_CHECK's scan for NaN and infinity runs as a
   kernel after its nest and stops the program there.

   Compile and cache: kernels of the same code over other buffers (a model's layers) launch one
   function, so NVRTC reads each code once (a 6-layer GPT's step: 248 kernels, 56 functions).
   CUBIN for the device's architecture (sm_XY), on disk in the compile cache under a key of
   source, architecture, NVRTC's version and options, and in memory per process.
   Floating-point contraction is off (--fmad=false), as on the CPU: a value computed
   again in another kernel must have the same bits (max's gradient compares them).
   TG_DEBUG >= 2 keeps each program's .cu beside its .ir listing; TG_DEBUG >= 4 compiles with
   device debug information and line numbers (-G -lineinfo) under the name of that .cu, so
   cuda-gdb stops inside a generated kernel and shows its source.

   Memory: freed buffers return to a cache of blocks by size class and are reused (the one freed
   last first); when an allocation fails, the cache is released and the allocation tried again.
   All work goes to one stream of the device, so reusing a block is ordered after the kernels
   that used it. Copies from the host return while the GPU copies (reads of values wait); Event
   marks a point in a device's work.

   Several GPUs: CUDA:1, CUDA:2, ... (CUDA is CUDA:0), each with its own context, stream and
   queue thread; copies between them are peer copies (cuMemcpyPeerAsync). NCCL (Nccl, below)
   sums tensors across processes for tg::DataParallel::all_reduce. Copies between GPUs have
   run only on the CPU stand-in of make test (two GPUs' copies and DataParallel); NCCL with
   one rank has run on a GPU, across processes (2 and 3) only on the stand-in's NCCL. */
#ifndef TINYGRAD_CUDA_BACKEND_HPP_INCLUDED
#define TINYGRAD_CUDA_BACKEND_HPP_INCLUDED

#include "tinygrad.hpp"

namespace tg {
namespace cuda {
// The driver loads and a GPU is present (false, with the reason in *why, otherwise).
bool available(std::string* why = nullptr);
// NVRTC loads (the GPU is not needed to compile).
bool nvrtc_available(std::string* why = nullptr);
// Waits until every copy and kernel queued on the CUDA device has finished.
void synchronize();
// The GPU's name as the driver gives it, for device CUDA, CUDA:1, ... (a tg::Error as
// available() describes where there is none)
std::string gpu_name(const std::string& device = "CUDA");
// With TG_CUDA_PROFILE=1, programs run kernel by kernel (no graphs), each kernel timed on the
// GPU between two events; this is the table of the kernels that took the most time so far
// (program, as TG_DEBUG=2 names its files, kernel, the nest it computes, calls, total and
// mean time), which is also printed to stderr at exit (then every kernel's). Empty when nothing
// was profiled.
std::string profile_report(size_t top = 25);

// A point in a CUDA device's work (seed 002's events): made, it stands for everything queued
// on the device so far (copies from the host and programs run while the host goes on; reading
// values waits for them).
class Event {
public:
    explicit Event(const std::string& device = "CUDA");
    bool done() const;           // that work has finished
    void synchronize() const;    // waits until it has
    // work queued on `device` (another GPU) from now on starts after this point
    void happens_before(const std::string& device) const;
    // GPU time from `earlier` to this point (waits for both)
    double milliseconds_since(const Event& earlier) const;
    struct State;

private:
    std::shared_ptr<State> state_;
};

// NCCL: tensors summed across processes, one process per GPU, for DataParallel across
// machines (seed 000's merge, where a process cannot read another's memory). libnccl.so.2 is
// opened with dlopen at first use (TG_NCCL_LIBRARY: another file). Every process of a job
// joins one communicator with the same id, which rank 0 makes.
std::string nccl_unique_id();   // 256 hex digits
class Nccl {
public:
    // this process is `rank` of `ranks`, on `device` (CUDA, CUDA:1, ...)
    Nccl(int rank, int ranks, const std::string& unique_id, const std::string& device = "CUDA");
    // TG_NCCL_RANK and TG_NCCL_RANKS, and the id in TG_NCCL_ID, or in the file
    // TG_NCCL_ID_FILE, which rank 0 writes and the others wait for (up to a minute; a new
    // file for each job)
    static Nccl from_environment(const std::string& device = "CUDA");
    // each tensor (float32 or float64, realized on the device) becomes its sum over the
    // ranks, in place
    void all_reduce_sum(const std::vector<Tensor>& tensors);
    // the sum over the ranks as DataParallel takes it: dp.all_reduce(nccl.all_reduce(),
    // nccl.ranks())
    DataParallel::AllReduce all_reduce();
    int rank() const;
    int ranks() const;
    struct State;

private:
    std::shared_ptr<State> state_;
};
}  // namespace cuda

namespace detail {
// CUDA C for a program: a __global__ function per kernel, named k0, k1, k3_1, ... (extern "C"),
// but a kernel of the same code as an earlier one launches that one's function; and for each
// kernel (kernels_of's order), the function it launches and its buffers in the function's order.
struct CudaSource {
    std::string text;
    std::vector<std::string> function;
    std::vector<std::vector<int>> buffers;
    std::vector<std::vector<size_t>> offsets;   // bytes into each buffer a kernel is passed
};
CudaSource render_cuda_kernels(const Program& program);
std::string render_cuda(const Program& program);   // render_cuda_kernels' text
// what the CUDA C kernels of body need before them: typedefs, macros and the helpers they call
std::string cuda_prelude(const std::string& body);
// How a nest runs on the GPU ([CUDA RENDER] says why): its grid loops, one item each; the
// body each item runs, by one thread or (cooperative) by a block of CUDA_BLOCK_THREADS.
const int CUDA_BLOCK_THREADS = 256;
struct KernelPlan {
    std::vector<const Stmt*> grid;      // loops, outermost first
    const Stmt* serial = nullptr;       // a loop around the grid's, run inside each item
    std::vector<const Stmt*> values;    // accumulators set once around the grid loops
    const std::vector<Stmt>* body;      // what each item runs (in serial's loop if any)
    int64_t items = 1;
    bool cooperative = false;
    bool warp = false;   // cooperative by a warp per item (WARP_ITEMS items a block)
    // a matrix product, a block per square tile of outputs (items: the tiles), its sums split
    // in `splits` ranges of terms where it has few tiles and long sums (outputs: its outputs);
    // or a scatter (serial) whose rows are split in `splits` ranges of rows_each, each adding
    // into its own zeroed copy of the `outputs` elements of buffer scatter_buffer; or a sum of
    // each of few columns (column_sum) whose rows (terms) are split in `splits` ranges of
    // rows_each, a thread per range and column (items: outputs x splits); or a cooperative
    // sum whose terms are split in `splits` ranges of rows_each, a block per range and item
    // (items: outputs x splits)
    bool product = false, column_sum = false;
    int64_t splits = 1, outputs = 0, rows_each = 0;
    int scatter_buffer = -1;
    int64_t blocks() const {
        if (warp) return (items + CUDA_BLOCK_THREADS / 32 - 1) / (CUDA_BLOCK_THREADS / 32);
        return cooperative || product ? items
                                      : (items + CUDA_BLOCK_THREADS - 1) / CUDA_BLOCK_THREADS;
    }
};
const int CUDA_TILE_TERMS = 16;
KernelPlan plan_kernel(const Program& program, size_t block, const Block& nest);
// One kernel launch: nest `block` whole, or one of its statements (part), named k0, k3_1, ...
struct Launch {
    size_t block;
    Block part;
    std::string name;
    // split sums: 1, the partial sums of each range (into a scratch buffer of splits x outputs
    // floats; a product's, column sum's or block sum's last range of each tile, column or
    // item to finish adds them and runs the epilogue); 2, a split scatter's second kernel,
    // which adds them
    int stage = 0;
};
std::vector<Launch> launches_of(const Program& program);
// The kernels of those launches: each runs one launch, or several side by side, each on a range
// of its blocks, or several of one thread each in order, in one thread (in_sequence) (indices
// into launches, in order; see [CUDA RENDER]).
std::vector<std::vector<size_t>> kernels_of(const Program& program,
                                            const std::vector<Launch>& launches);
bool in_sequence(const Program& program, const std::vector<Launch>& launches,
                 const std::vector<size_t>& kernel);
// NVRTC: CUDA C to a CUBIN for sm_<arch> (e.g. 90); a compile error is a tg::Error with
// NVRTC's log. name: the file name that line information and messages use.
std::string nvrtc_compile(const std::string& source, int arch, const std::string& name = "tg.cu",
                          bool debug_info = false);
// NVRTC to PTX for compute_<arch>, not assembled, and not cached, with flags in place of
// TG_NVRTC_FLAGS: what a test asks to check that generated code compiles, in a seventh of the
// time (ptxas takes the rest); the shared memory a kernel declares is checked only by
// assembling it.
void nvrtc_check(const std::string& source, int arch, const std::string& name,
                 const std::string& flags);
// the names of the driver's functions that are looked up in libcuda.so.1
std::vector<std::string> cuda_driver_symbol_names();
}  // namespace detail
}  // namespace tg

#endif  // TINYGRAD_CUDA_BACKEND_HPP_INCLUDED

#if defined(TINYGRAD_IMPLEMENTATION) && !defined(TINYGRAD_CUDA_IMPLEMENTATION_DONE)
#define TINYGRAD_CUDA_IMPLEMENTATION_DONE
#ifndef TINYGRAD_IMPLEMENTATION_DONE
#error "cuda_backend.hpp: include tinygrad.hpp (with TINYGRAD_IMPLEMENTATION) first"
#endif

namespace tg {
namespace detail {

// ---- [CUDA LOADER] the driver API and NVRTC, opened with dlopen ------------------------------
// Only the calls used here, with the types of cuda.h written out (handles are pointers,
// device addresses 64-bit integers), so nothing of CUDA is needed to build.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUhandle = void*;   // CUcontext, CUmodule, CUfunction, CUstream, CUevent, CUgraph...
enum : int {
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_READY = 600,
};
struct CudaKernelNodeParams {   // CUDA_KERNEL_NODE_PARAMS_v2
    CUhandle func;
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    void** params;
    void** extra;
    CUhandle kernel, context;   // unused: func is set
};

struct CudaDriver {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int*);
    CUresult (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
    CUresult (*cuDeviceGetName)(char*, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUhandle*, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUhandle);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocHost)(void**, size_t);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUhandle);
    CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUhandle);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUhandle);
    CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUhandle, CUdeviceptr, CUhandle, size_t, CUhandle);
    CUresult (*cuEventCreate)(CUhandle*, unsigned);
    CUresult (*cuEventRecord)(CUhandle, CUhandle);
    CUresult (*cuEventQuery)(CUhandle);
    CUresult (*cuEventSynchronize)(CUhandle);
    CUresult (*cuEventElapsedTime)(float*, CUhandle, CUhandle);
    CUresult (*cuEventDestroy)(CUhandle);
    CUresult (*cuStreamWaitEvent)(CUhandle, CUhandle, unsigned);
    CUresult (*cuGraphCreate)(CUhandle*, unsigned);
    CUresult (*cuGraphAddKernelNode)(CUhandle*, CUhandle, const CUhandle*, size_t,
                                     const CudaKernelNodeParams*);
    CUresult (*cuGraphInstantiate)(CUhandle*, CUhandle, unsigned long long);
    CUresult (*cuGraphExecKernelNodeSetParams)(CUhandle, CUhandle, const CudaKernelNodeParams*);
    CUresult (*cuGraphLaunch)(CUhandle, CUhandle);
    CUresult (*cuGraphExecDestroy)(CUhandle);
    CUresult (*cuGraphDestroy)(CUhandle);
    CUresult (*cuModuleLoadData)(CUhandle*, const void*);
    CUresult (*cuModuleGetFunction)(CUhandle*, CUhandle, const char*);
    CUresult (*cuModuleUnload)(CUhandle);
    CUresult (*cuLaunchKernel)(CUhandle, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUhandle, void**, void**);
    CUresult (*cuStreamCreate)(CUhandle*, unsigned);
    CUresult (*cuStreamSynchronize)(CUhandle);
    CUresult (*cuGetErrorName)(CUresult, const char**);
    CUresult (*cuGetErrorString)(CUresult, const char**);
};

using nvrtcResult = int;
struct Nvrtc {
    nvrtcResult (*nvrtcVersion)(int*, int*);
    nvrtcResult (*nvrtcCreateProgram)(void**, const char*, const char*, int, const char* const*,
                                      const char* const*);
    nvrtcResult (*nvrtcCompileProgram)(void*, int, const char* const*);
    nvrtcResult (*nvrtcGetProgramLogSize)(void*, size_t*);
    nvrtcResult (*nvrtcGetProgramLog)(void*, char*);
    nvrtcResult (*nvrtcGetCUBINSize)(void*, size_t*);
    nvrtcResult (*nvrtcGetCUBIN)(void*, char*);
    nvrtcResult (*nvrtcDestroyProgram)(void**);
    const char* (*nvrtcGetErrorString)(nvrtcResult);
    int major = 0, minor = 0;
};

// Opens the first library of names that loads and looks up every symbol; the reason it could
// not, otherwise.
static bool open_library(const std::vector<const char*>& names,
                         const std::vector<std::pair<const char*, void**>>& symbols,
                         std::string& why) {
    void* lib = nullptr;
    std::string first_error;
    for (const char* n : names) {
        if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
        const char* e = dlerror();
        if (first_error.empty()) first_error = e ? e : n;
    }
    if (!lib) {
        why = "cannot load " + std::string(names[0]) + " (" + first_error + ")";
        return false;
    }
    for (auto& [name, slot] : symbols)
        if (!(*slot = dlsym(lib, name))) {
            why = std::string(names[0]) + " has no " + name + " (too old?)";
            return false;
        }
    return true;
}

#define TG_SYM(table, name, symbol) {symbol, reinterpret_cast<void**>(&table.name)}

// The driver's entry points by the names its library exports (cuda.h maps several calls to a
// _v2 name), each with its slot in d.
static std::vector<std::pair<const char*, void**>> cuda_driver_symbols(CudaDriver& d) {
    return {TG_SYM(d, cuInit, "cuInit"), TG_SYM(d, cuDeviceGetCount, "cuDeviceGetCount"),
            TG_SYM(d, cuDeviceGet, "cuDeviceGet"),
            TG_SYM(d, cuDeviceGetAttribute, "cuDeviceGetAttribute"),
            TG_SYM(d, cuDeviceGetName, "cuDeviceGetName"),
            TG_SYM(d, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
            TG_SYM(d, cuCtxSetCurrent, "cuCtxSetCurrent"),
            TG_SYM(d, cuMemAlloc, "cuMemAlloc_v2"), TG_SYM(d, cuMemFree, "cuMemFree_v2"),
            TG_SYM(d, cuMemAllocHost, "cuMemAllocHost_v2"),
            TG_SYM(d, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
            TG_SYM(d, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
            TG_SYM(d, cuMemsetD8Async, "cuMemsetD8Async"),
            TG_SYM(d, cuMemcpyPeerAsync, "cuMemcpyPeerAsync"),
            TG_SYM(d, cuEventCreate, "cuEventCreate"), TG_SYM(d, cuEventRecord, "cuEventRecord"),
            TG_SYM(d, cuEventQuery, "cuEventQuery"),
            TG_SYM(d, cuEventSynchronize, "cuEventSynchronize"),
            TG_SYM(d, cuEventElapsedTime, "cuEventElapsedTime_v2"),
            TG_SYM(d, cuEventDestroy, "cuEventDestroy_v2"),
            TG_SYM(d, cuStreamWaitEvent, "cuStreamWaitEvent"),
            TG_SYM(d, cuGraphCreate, "cuGraphCreate"),
            TG_SYM(d, cuGraphAddKernelNode, "cuGraphAddKernelNode_v2"),
            TG_SYM(d, cuGraphInstantiate, "cuGraphInstantiateWithFlags"),
            TG_SYM(d, cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2"),
            TG_SYM(d, cuGraphLaunch, "cuGraphLaunch"),
            TG_SYM(d, cuGraphExecDestroy, "cuGraphExecDestroy"),
            TG_SYM(d, cuGraphDestroy, "cuGraphDestroy"),
            TG_SYM(d, cuModuleLoadData, "cuModuleLoadData"),
            TG_SYM(d, cuModuleGetFunction, "cuModuleGetFunction"),
            TG_SYM(d, cuModuleUnload, "cuModuleUnload"),
            TG_SYM(d, cuLaunchKernel, "cuLaunchKernel"),
            TG_SYM(d, cuStreamCreate, "cuStreamCreate"),
            TG_SYM(d, cuStreamSynchronize, "cuStreamSynchronize"),
            TG_SYM(d, cuGetErrorName, "cuGetErrorName"),
            TG_SYM(d, cuGetErrorString, "cuGetErrorString")};
}

std::vector<std::string> cuda_driver_symbol_names() {
    CudaDriver d;
    std::vector<std::string> names;
    for (auto& [name, slot] : cuda_driver_symbols(d)) names.push_back(name);
    return names;
}

// The driver, loaded once; null with *why set when it cannot be.
static const CudaDriver* cuda_driver(std::string* why) {
    static CudaDriver d;
    static std::string failure;
    static bool loaded = [] {
        std::string named = env_str("TG_CUDA_LIBRARY", "");
        return open_library(
            named.empty() ? std::vector<const char*>{"libcuda.so.1", "libcuda.so"}
                          : std::vector<const char*>{named.c_str()},
            cuda_driver_symbols(d), failure);
    }();
    if (!loaded && why) *why = "CUDA: " + failure + "; is the NVIDIA driver installed?";
    return loaded ? &d : nullptr;
}

static const Nvrtc* nvrtc(std::string* why) {
    static Nvrtc n;
    static std::string failure;
    static bool loaded = [] {
        std::string named = env_str("TG_NVRTC_LIBRARY", "");
        bool ok = open_library(
            named.empty() ? std::vector<const char*>{"libnvrtc.so", "libnvrtc.so.13",
                                                     "libnvrtc.so.12"}
                          : std::vector<const char*>{named.c_str()},
            {TG_SYM(n, nvrtcVersion, "nvrtcVersion"),
             TG_SYM(n, nvrtcCreateProgram, "nvrtcCreateProgram"),
             TG_SYM(n, nvrtcCompileProgram, "nvrtcCompileProgram"),
             TG_SYM(n, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
             TG_SYM(n, nvrtcGetProgramLog, "nvrtcGetProgramLog"),
             TG_SYM(n, nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
             TG_SYM(n, nvrtcGetCUBIN, "nvrtcGetCUBIN"),
             TG_SYM(n, nvrtcDestroyProgram, "nvrtcDestroyProgram"),
             TG_SYM(n, nvrtcGetErrorString, "nvrtcGetErrorString")},
            failure);
        if (ok) n.nvrtcVersion(&n.major, &n.minor);
        return ok;
    }();
    if (!loaded && why)
        *why = "CUDA: " + failure + "; NVRTC comes with the CUDA toolkit (add its lib directory "
               "to LD_LIBRARY_PATH)";
    return loaded ? &n : nullptr;
}
#undef TG_SYM

static std::string cu_error(const CudaDriver& d, CUresult r) {
    const char *name = nullptr, *text = nullptr;
    d.cuGetErrorName(r, &name);
    d.cuGetErrorString(r, &text);
    return strf("%s (%s)", name ? name : strf("error %d", r).c_str(), text ? text : "?");
}

// ---- [CUDA RENDER] loop IR → CUDA C -----------------------------------------------------------
// The C renderer's statements and expressions, with CUDA's dialect: __device__ helpers, fixed-
// width integer types defined here (NVRTC has no standard headers), the grid's thread index in
// place of the outer loops, and bounds checks that report through an atomic compare-and-swap.

// Whether the iterations of loop (in nest b, block k, inside the loops that run as threads)
// write disjoint parts of every buffer written (chunked, as in pass_parallel_loops), with no
// array declared around it (in the body of loop `around`, -1: the kernel's) that they share.
static bool iterations_disjoint(const Program& p, size_t k, const Block& b, const Stmt& loop,
                                int around) {
    for (const ProgramBuffer& pb : p.buffers)
        if (pb.local_block == int(k) && pb.local_loop == around) return false;
    BlockAccesses uses = block_accesses(b);
    std::map<int, Chunk> chunks;
    for (const Access& a : uses.accesses) {
        if (!uses.writes(a.buffer) || p.buffers[size_t(a.buffer)].local_block == int(k)) continue;
        if (!chunked(a.idx, loop, b.extents, chunks[a.buffer])) return false;
    }
    return true;
}

// How a nest runs. Its outer loops, while each is the whole body of the one before (after
// accumulators that are set and never updated: values every thread computes) and its
// iterations are disjoint, are the grid: one item each. An item is one thread, which runs the
// rest (body) as the loop IR says; or, for a nest of few items with long reductions
// (cooperative), a block of CUDA_BLOCK_THREADS threads that split each loop of the body in a
// fixed way (thread l takes iterations l, l + 256, ...) and combine their partial results in
// a fixed tree (tg_block_reduce), so the result is the same on every run. A nest whose items
// each walk rows of their own (their accesses move by one element along a loop inside the
// item, none along the innermost grid loop: a layer norm's or a softmax's rows: walks_rows, in
// tinygrad.hpp's [PASSES], whose fuse_maps joins the nests of such rows) runs so with up to
// ROWS_MAX items: a thread per item would leave most of the GPU idle and read memory with the
// threads of a warp a row apart, where a block reads each row in step.
// Where there are more such rows than one wave of blocks (8 blocks of 256 threads fill a
// multiprocessor), each of at most warp_max_row_work iterations (a GPT's layer norm, softmax
// and loss), they run a warp per row instead, 8 rows a block, combined by shuffles alone
// (tg_warp_reduce): a block of 256 threads would leave most of them idle on a row of 64 and
// wait at its barriers. Rows whose every loop is shorter than a block (some of its threads
// would have no iteration), down to a warp's width (the softmax of a short context, a small
// vocabulary's loss, a narrow model's layer norm), run a warp per row however many: a thread
// per row would read them a row apart, on few multiprocessors. A sum of fewer items than
// multiprocessors and many terms is split over blocks (split_block_sums).
static const int64_t GPU_MULTIPROCESSORS = 132;   // an H100's; what the grids aim to fill
static const int64_t COOPERATIVE_MAX_ITEMS = 4096;

// The sizes at which a nest takes one plan or another (the plans below say why each is what it
// is). TG_CUDA_SMALL_PLANS=1 makes them a test's, so that graphs of a few elements reach every
// plan: make test runs random graphs so on the CPU stand-in against the interpreter.
struct PlanSizes {
    int64_t cooperative_min_work = 1024;   // an item's iterations for a block to share it
    int64_t warp_min_rows = 8 * GPU_MULTIPROCESSORS, warp_max_row_work = 4096;   // a warp a row
    int64_t split_min_terms = 1024, split_terms_each = 256;   // a product's sum split in ranges
    int64_t long_sum_terms = 4096;                            // a product's larger tiles
    int64_t scatter_rows_each = 32;                           // split_scatter
    int64_t column_rows_each = 64, column_min_work = int64_t(1) << 20;   // split_columns
    int64_t block_terms_each = 8192;                                      // split_block_sums
};
static PlanSizes plan_sizes() {
    PlanSizes s;
    if (env_int("TG_CUDA_SMALL_PLANS", 0, 0, 1) == 1) {
        s.cooperative_min_work = 16;
        s.warp_min_rows = 4;
        s.warp_max_row_work = 128;
        s.split_min_terms = 16;
        s.split_terms_each = 8;
        s.long_sum_terms = 64;
        s.scatter_rows_each = 2;
        s.column_rows_each = 2;
        s.column_min_work = 16;
        s.block_terms_each = 16;
    }
    return s;
}

// Whether the iterations of loop m, directly inside loop l, touch disjoint parts of every
// buffer written over all iterations of l as well: the part of m's iteration is its chunk
// plus a base that depends on l (a row picked by index, as a scatter does) only in whole
// multiples of the span of m's chunks. Then m can run as the grid with l inside each thread,
// which keeps l's order for each part (a scatter sums its rows in order).
static bool columns_disjoint(const Block& b, const Stmt& m) {
    BlockAccesses uses = block_accesses(b);
    std::map<int, Chunk> chunks;
    for (const Access& a : uses.accesses) {
        if (!uses.writes(a.buffer)) continue;
        Chunk& c = chunks[a.buffer];
        if (!chunked(a.idx, m, b.extents, c)) return false;
        int64_t span = c.stride * b.extents[size_t(m.id)];
        if (span == 0) return false;   // every iteration writes the same place, or none runs
        Linear base;
        base.add(1, c.base);
        if (base.constant % span) return false;
        for (auto& [coef, term] : base.terms)
            if (coef % span) return false;
    }
    return true;
}

// A term of a sum's trees with the loops around it, outermost first: `terms` of the sum's
// terms, numbered in the trees' order (an output adds them in that order); in a product, the
// term is x·y (a fused multiply-add, as in the loops).
struct SumSegment {
    std::vector<const Stmt*> loops;
    ExprP term, x, y;
    int64_t terms = 1;
};

// A matrix product on the GPU: a nest that pass_tile_products' match_product takes (output loops
// holding sum trees of x(i, k)·y(k, j), then an epilogue of stores), whose sums all add into the
// one accumulator the epilogue reads. Each block computes a tile of T rows by T columns, its 16 x
// 16 threads T/16 x T/16 of them each in registers, from CUDA_TILE_TERMS terms at a time of x and y
// staged in shared memory, in two buffers: the loads of the next terms are in flight while the
// products of these run, so one barrier per step suffices. A thread's rows (and columns) come in
// runs of 4 (2 for T = 32), read with one vector load. T is 64; or 128 (twice the multiply-adds
// per value read from shared memory, two blocks a multiprocessor) where its tiles are more than
// the multiprocessors and the busiest multiprocessor computes no more outputs than with 64 (an
// 8192 x 512 product: two tiles of 128 on each, or eight of 64); or 32 where 64 would leave
// multiprocessors idle. TG_CUDA_TILE=32, 64 or 128 sets it. Where the tiles are fewer than the
// multiprocessors and the sums long (a weight's gradient: few outputs, a term per token), the
// terms are split into ranges of at least split_terms_each, at most two blocks a multiprocessor
// of tiles and ranges, each writing its partial sums to a scratch buffer; the range of each
// tile that finishes last adds each output's ranges in order, then runs the epilogue
// (last_range_goes_on). A sum of long_sum_terms or more takes tiles of 128 x 128 (or 64 x 64
// rather than 32 x 32) split so, where they are fewer than the multiprocessors. The terms are
// numbered in the order of the trees (segments: a term and the loops around it), and each
// output adds them in that order into one sum, as cuBLAS does (the trees' own grouping is not
// kept: a fixed order still, so the bits are the same on every run). Bounds are tested only
// where a tile or a step of terms can pass the end.
struct ProductPlan {
    ProductMatch match;
    std::vector<SumSegment> segments;
    int sum = -1;                     // the accumulator the epilogue reads
    int64_t rows = 1, cols = 1, terms = 0, outer = 1;
    int tile = 64;
    bool tf32 = false;            // on tensor cores (TG_CUDA_TF32=1)
    int64_t splits = 1, split_terms = 0;   // ranges of terms, each of split_terms (the last less)
    int64_t tiles(int t) const { return outer * ((rows + t - 1) / t) * ((cols + t - 1) / t); }
    int64_t tiles() const { return tiles(tile); }
};
// A row of staged terms: 4 floats more than the tile keep vector loads aligned and spread a
// warp's reads over the banks; 8 more spread a tensor core operand's (lane 4g + q reads row q,
// column g: bank 8q + g). Two buffers of each operand's rows of staged terms.
static int staged_row(const ProductPlan& plan) { return plan.tile + (plan.tf32 ? 8 : 4); }
static int64_t staged_floats(const ProductPlan& plan) {
    return 2 * 2 * int64_t(CUDA_TILE_TERMS) * staged_row(plan);
}
static void sum_segments(const std::vector<Stmt>& body, const Block& b,
                         std::vector<const Stmt*>& loops, std::vector<SumSegment>& out) {
    for (const Stmt& st : body) {
        if (st.kind == SK::LOOP) {
            loops.push_back(&st);
            sum_segments(st.body, b, loops, out);
            loops.pop_back();
            continue;
        }
        if (!is_term(st)) continue;   // an accumulator's start, or a sum added into another
        SumSegment seg;
        seg.term = st.val;
        seg.loops = loops;
        for (const Stmt* l : loops) seg.terms *= b.extents[size_t(l->id)];
        out.push_back(seg);
    }
}
// The accumulator that the epilogue reads and every accumulator of the trees is added into
// (through the ones it is added into); -1 where there is no such one.
static int single_sum(const std::vector<Stmt>& trees, const std::vector<Stmt>& epilogue) {
    std::unordered_set<int> read, set;
    accs_read(epilogue, read);
    accs_set(trees, set);
    int sum = -1;
    for (int acc : read)
        if (set.count(acc)) {
            if (sum >= 0) return -1;   // two sums
            sum = acc;
        }
    if (sum < 0) return -1;
    std::unordered_map<int, int> into;
    std::function<void(const std::vector<Stmt>&)> edges = [&](const std::vector<Stmt>& body) {
        for (const Stmt& st : body) {
            if (st.kind == SK::ACC_UPDATE && st.val->kind == EK::ACC) into[st.val->id] = st.id;
            edges(st.body);
        }
    };
    edges(trees);
    for (int acc : set) {
        int a = acc;
        for (size_t hops = 0; a != sum && hops <= set.size(); hops++) {
            auto next = into.find(a);
            if (next == into.end()) return -1;
            a = next->second;
        }
        if (a != sum) return -1;
    }
    return sum;
}
static bool plan_product(const Block& b, ProductPlan& plan) {
    ProductMatch& m = plan.match;
    if (!match_product(b, m) || m.rows < 0 || m.column_products) return false;
    plan.sum = single_sum(m.trees, m.epilogue);
    if (plan.sum < 0) return false;
    std::vector<const Stmt*> loops;
    sum_segments(m.trees, b, loops, plan.segments);
    for (SumSegment& seg : plan.segments) {
        int x_at = 0;
        if (seg.term->kind != EK::ALU || seg.term->op != Op::MUL ||
            !split_term(seg.term, m.rows, m.cols, seg.x, seg.y, x_at) || !seg.x)
            return false;
        plan.terms += seg.terms;
    }
    plan.rows = b.extents[size_t(m.rows)];
    plan.cols = b.extents[size_t(m.cols)];
    for (int v : m.loops)
        if (v != m.rows && v != m.cols) plan.outer *= b.extents[size_t(v)];
    const PlanSizes sizes = plan_sizes();
    plan.tile = env_int("TG_CUDA_TILE", 0, 0, 128);
    if (plan.tile != 32 && plan.tile != 64 && plan.tile != 128) {
        auto busiest = [&](int t) {   // outputs of the multiprocessor with the most tiles
            return (plan.tiles(t) + GPU_MULTIPROCESSORS - 1) / GPU_MULTIPROCESSORS * t * t;
        };
        plan.tile = plan.tiles(128) > GPU_MULTIPROCESSORS && busiest(128) <= busiest(64) ? 128
                    : plan.tiles(64) < GPU_MULTIPROCESSORS                               ? 32
                                                                                         : 64;
        // a long sum takes a larger tile, fewer than the multiprocessors, whose ranges of terms
        // fill two blocks a multiprocessor: rather than 32 x 32 tiles (4 multiply-adds a thread
        // per 2 values read), or 64 x 64 ones (a 512 x 2048 weight gradient of 8192 tokens: 256
        // tiles, or 64 of 128 in 4 ranges, as many multiply-adds on the busiest)
        for (int t : {128, 64})
            if (plan.tile < t && plan.tiles(t) < GPU_MULTIPROCESSORS &&
                plan.terms >= sizes.long_sum_terms &&
                plan.tiles(t) * (plan.terms / sizes.split_terms_each) >= 2 * GPU_MULTIPROCESSORS)
                plan.tile = t;
    }
    plan.tf32 = env_int("TG_CUDA_TF32", 0, 0, 1) == 1;
    plan.split_terms = plan.terms;
    if (plan.terms >= sizes.split_min_terms && plan.tiles() < GPU_MULTIPROCESSORS) {
        int64_t want = 2 * GPU_MULTIPROCESSORS / plan.tiles();   // at most two a multiprocessor
        int64_t splits = std::min(want, plan.terms / sizes.split_terms_each);
        int64_t each = (plan.terms + splits - 1) / splits;
        plan.split_terms = (each + CUDA_TILE_TERMS - 1) / CUDA_TILE_TERMS * CUDA_TILE_TERMS;
        plan.splits = (plan.terms + plan.split_terms - 1) / plan.split_terms;
    }
    return plan.outer * plan.rows * plan.cols * plan.terms >=
           env_int("TG_TILE_MIN_WORK", TILE_MIN_WORK, 0, INT32_MAX);
}

// A scatter (plan.serial) of few columns and many rows runs a thread per column, each adding
// its rows in order: a chain of read-add-writes that waits on memory at every row. Where its
// body only adds float32 values (a scatter's max= stays whole) into one buffer that it does
// not read, the rows are split into ranges of at least scatter_rows_each, a thread per range
// and column adding into the range's own copy of that buffer (scratch, zeroed before each
// run; at most SPLIT_MAX_SCRATCH floats in all); a second kernel adds each element's copies, in
// the ranges' order, into the buffer.
static const int64_t SPLIT_MAX_SCRATCH = int64_t(1) << 23;
static void split_scatter(const Program& p, const Block& b, KernelPlan& plan) {
    int into = -1;
    for (const Stmt& st : *plan.body) {
        if (st.kind == SK::CHECK) continue;
        if (st.kind != SK::STORE_ADD || st.op != Op::REDUCE_SUM || (into >= 0 && st.id != into))
            return;
        into = st.id;
    }
    if (into < 0 || p.buffers[size_t(into)].dtype != DType::FLOAT32) return;
    for (const Access& a : block_accesses(b).accesses)
        if (a.buffer == into && !a.write) return;
    int64_t rows = b.extents[size_t(plan.serial->id)], elements = p.buffers[size_t(into)].numel;
    int64_t want = (2 * GPU_MULTIPROCESSORS * CUDA_BLOCK_THREADS + plan.items - 1) / plan.items;
    int64_t splits =
        std::min({want, rows / plan_sizes().scatter_rows_each, SPLIT_MAX_SCRATCH / elements});
    if (splits < 2) return;
    plan.rows_each = (rows + splits - 1) / splits;
    plan.splits = (rows + plan.rows_each - 1) / plan.rows_each;
    plan.outputs = elements;
    plan.scatter_buffer = into;
    plan.items *= plan.splits;
}

// A sum of each of few columns over many rows (a bias's gradient: a column per feature, a row
// per token) would run a block per column whose threads read a column apart, or a thread per
// column that leaves most of the GPU idle. Where every load of its terms that moves with the
// column reads the next element for the next column, the rows (the terms, numbered in the
// trees' order) are split into ranges of at least column_rows_each, a thread per range and
// column adding its range in order into scratch, the threads of a warp reading side by side;
// the range of each column that finishes last adds its ranges in order and runs the epilogue
// (last_range_goes_on). Only for column_min_work terms in all or more: smaller sums would gain
// less than a launch costs.
// A body that is one sum tree and its epilogue (trees_and_epilogue; its terms bounds-checked
// only where checks), the accumulator they add into and the tree's segments.
struct SumTree {
    std::vector<Stmt> trees, epilogue;
    std::vector<SumSegment> segments;
    int sum = -1;
    int64_t terms = 0;   // each item's
};
static bool match_sum(const std::vector<Stmt>& body, const Block& b, bool checks, SumTree& s) {
    std::vector<ExprP> terms;
    if (!trees_and_epilogue(body, b.extents, s.trees, s.epilogue, terms, s.terms, checks))
        return false;
    s.sum = single_sum(s.trees, s.epilogue);
    std::vector<const Stmt*> loops;
    sum_segments(s.trees, b, loops, s.segments);
    return s.sum >= 0;
}
static void split_ranges(int64_t terms, int64_t splits, int64_t multiple, KernelPlan& plan) {
    plan.rows_each = ((terms + splits - 1) / splits + multiple - 1) / multiple * multiple;
    plan.splits = (terms + plan.rows_each - 1) / plan.rows_each;
    plan.outputs = plan.items;
    plan.items *= plan.splits;
}
static bool plan_column_sum(const Block& b, const KernelPlan& plan, SumTree& cs) {
    if (plan.grid.empty() || !match_sum(*plan.body, b, false, cs)) return false;
    int column = plan.grid.back()->id;
    bool along = false, apart = false;
    ExprSet seen;
    for (const SumSegment& seg : cs.segments)
        each_part(seg.term, seen, [&](const ExprP& part) {
            if (part->kind != EK::LOAD || !uses_var(part->src[0], column)) return;
            (steps_by_one(part->src[0], column) ? along : apart) = true;
        });
    return along && !apart;
}
static void split_columns(const Block& b, KernelPlan& plan) {
    SumTree cs;
    const PlanSizes sizes = plan_sizes();
    if (!plan_column_sum(b, plan, cs) || plan.items * cs.terms < sizes.column_min_work) return;
    int64_t want = (2 * GPU_MULTIPROCESSORS * CUDA_BLOCK_THREADS + plan.items - 1) / plan.items;
    int64_t splits =
        std::min({want, cs.terms / sizes.column_rows_each, SPLIT_MAX_SCRATCH / plan.items});
    if (splits < 2) return;
    split_ranges(cs.terms, splits, 1, plan);
    plan.column_sum = true;
}

// A cooperative sum of fewer items than multiprocessors (a whole tensor's sum: one item) would
// leave the rest idle, one block reading all the terms. Its terms (numbered in the trees'
// order) are split into ranges of at least block_terms_each, a multiple of the block's
// threads (or of block_terms_each, where a test's sizes make it less), at most two blocks a
// multiprocessor of items and ranges: a block per range and item
// adds its range as a whole item's sum does and writes the total to scratch; the item's range
// that finishes last adds the item's ranges in order (last_range_goes_on) and runs the
// epilogue. How many ranges depends on the sizes alone, so the bits are the same on every run.
static void split_block_sums(const Block& b, KernelPlan& plan) {
    SumTree tree;
    if (plan.items >= GPU_MULTIPROCESSORS || !match_sum(*plan.body, b, false, tree)) return;
    const int64_t each = plan_sizes().block_terms_each;
    int64_t splits = std::min({2 * GPU_MULTIPROCESSORS / plan.items, tree.terms / each,
                               SPLIT_MAX_SCRATCH / plan.items});
    if (splits >= 2)
        split_ranges(tree.terms, splits, std::min<int64_t>(each, CUDA_BLOCK_THREADS), plan);
}

KernelPlan plan_kernel(const Program& p, size_t k, const Block& b) {
    KernelPlan plan;
    plan.body = &b.body;
    int around = -1;
    std::unordered_set<int> updated;
    acc_updates(b.body, updated);
    for (;;) {   // [values...] loop: the values are computed by every thread
        const std::vector<Stmt>& body = *plan.body;
        size_t values = 0;
        while (values < body.size() && body[values].kind == SK::ACC_INIT &&
               !updated.count(body[values].id))
            values++;
        if (values + 1 != body.size() || body[values].kind != SK::LOOP ||
            !iterations_disjoint(p, k, b, body[values], around))
            break;
        const Stmt& loop = body[values];
        for (size_t i = 0; i < values; i++) plan.values.push_back(&body[i]);
        plan.grid.push_back(&loop);
        plan.items *= b.extents[size_t(loop.id)];
        around = loop.id;
        plan.body = &loop.body;
    }
    bool arrays = false;
    for (const ProgramBuffer& pb : p.buffers) arrays = arrays || pb.local_block == int(k);
    const std::vector<Stmt>& body = *plan.body;
    if (plan.grid.empty() && !arrays && body.size() == 1 && body[0].kind == SK::LOOP &&
        body[0].body.size() == 1 && body[0].body[0].kind == SK::LOOP &&
        columns_disjoint(b, body[0].body[0])) {
        plan.serial = &body[0];
        plan.grid.push_back(&body[0].body[0]);
        plan.items = b.extents[size_t(body[0].body[0].id)];
        plan.body = &body[0].body[0].body;
        split_scatter(p, b, plan);
        return plan;
    }
    ProductPlan product;
    if (!arrays && plan.values.empty() && plan_product(b, product) &&
        product.match.loops.size() == plan.grid.size()) {
        plan.product = true;
        plan.items = product.tiles() * product.splits;
        plan.splits = product.splits;
        plan.outputs = product.outer * product.rows * product.cols;
        return plan;
    }
    if (!arrays) split_columns(b, plan);
    if (plan.column_sum) return plan;
    std::unordered_map<int, DType> accs;
    int64_t work = loop_work(*plan.body, b.extents);
    const PlanSizes sizes = plan_sizes();
    bool few_items = plan.items <= COOPERATIVE_MAX_ITEMS && work >= sizes.cooperative_min_work;
    std::vector<int> grid;
    for (const Stmt* l : plan.grid) grid.push_back(l->id);
    bool rows = plan.items <= ROWS_MAX && work >= ROW_MIN_WORK && walks_rows(b, grid);
    int64_t widest = 0;   // the most iterations a group splits in a loop of the item
    for (const Stmt& st : *plan.body) {
        if (st.kind != SK::LOOP) continue;
        std::vector<const Stmt*> chain;   // a reduction's: all its levels' iterations
        ExprP value;
        int64_t n = 1;
        if (chain_acc(st, chain, value) >= 0)
            for (const Stmt* l : chain) n *= b.extents[size_t(l->id)];
        else
            n = b.extents[size_t(st.id)];
        widest = std::max(widest, n);
    }
    bool short_rows = rows && widest < CUDA_BLOCK_THREADS;
    plan.cooperative = (few_items || rows) && !arrays && cooperative_body(*plan.body, accs);
    plan.warp = plan.cooperative && rows && work <= sizes.warp_max_row_work &&
                (plan.items > sizes.warp_min_rows || short_rows);
    if (plan.cooperative && !plan.warp) split_block_sums(b, plan);
    return plan;
}

// A split nest's launches: a product's or column sum's one, whose ranges add their totals;
// a scatter's two, the partial sums into scratch, then their totals (and the scan of
// TG_CHECK, if any, after the second).
static void push_split(std::vector<Launch>& out, size_t k, const Block& b,
                       const std::string& name, const KernelPlan& plan) {
    if (!plan.serial) {
        out.push_back({k, b, name, 1});
        return;
    }
    Block first = b;
    first.finite_site = -1;
    out.push_back({k, first, name + "_terms", 1});
    out.push_back({k, b, name, 2});
}

// The launches of nest k: the nest as one kernel, or one kernel per statement when the nest
// has no grid loop and its statements share no accumulator (an optimizer's update: a scalar
// step count, then a loop per tensor). Each statement then gets a grid of its own; the
// kernels' order keeps the statements' order.
std::vector<Launch> launches_of(const Program& p) {
    std::vector<Launch> out;
    for (size_t k = 0; k < p.blocks.size(); k++) {
        const Block& b = p.blocks[k];
        KernelPlan plan = plan_kernel(p, k, b);
        if (plan.splits > 1) {
            push_split(out, k, b, strf("k%zu", k), plan);
            continue;
        }
        bool split = b.body.size() > 1 && plan.grid.empty();
        for (const Stmt& st : b.body)
            split = split && st.kind != SK::ACC_INIT && st.kind != SK::ACC_UPDATE;
        if (!split) {
            out.push_back({k, b, strf("k%zu", k)});
            continue;
        }
        for (size_t i = 0; i < b.body.size(); i++) {
            Block part = b;
            part.body = {b.body[i]};
            if (i + 1 < b.body.size()) part.finite_site = -1;   // the scan follows the last
            std::string name = strf("k%zu_%zu", k, i);
            KernelPlan part_plan = plan_kernel(p, k, part);
            if (part_plan.splits > 1) push_split(out, k, part, name, part_plan);
            else out.push_back({k, part, name});
        }
    }
    return out;
}

static void add_term(const SumSegment& seg, const Block& b, Stmt update, int l_id,
                     const std::string& loop, int64_t each, int& next_tmp, std::string& out,
                     int depth);
static Stmt sum_update(int acc) {   // acc += a term, float32
    return {SK::ACC_UPDATE, acc, Op::REDUCE_SUM, DType::FLOAT32, nullptr, nullptr, {}};
}
// A sum tree among an item's statements from body[s] (an accumulator started at 0, the loops
// of its segments and the partial sums added into it: the accurate-sum lowering's sum of a
// length that is no power of 16, in a nest of rows that fuse_maps joined): the end of the
// tree's statements and its segments; 0 where there is none, or where a statement after it
// reads an accumulator of the tree other than the sum. The group adds all its segments into
// one partial sum each and reduces once, as a nest of that sum alone does (cooperative_sum).
static size_t sum_tree_at(const std::vector<Stmt>& body, size_t s, const Block& b,
                          std::vector<SumSegment>& segments) {
    const Stmt& start = body[s];
    if (start.kind != SK::ACC_INIT || start.op != Op::REDUCE_SUM ||
        start.dtype != DType::FLOAT32 || !is_const(start.val, 0))
        return 0;
    size_t end = s + 1;
    while (end < body.size() && (body[end].kind == SK::LOOP || body[end].kind == SK::ACC_INIT ||
                                 body[end].kind == SK::ACC_UPDATE))
        end++;
    for (; end > s + 1; end--) {
        std::vector<Stmt> tree(body.begin() + std::ptrdiff_t(s),
                               body.begin() + std::ptrdiff_t(end));
        std::vector<Stmt> after(body.begin() + std::ptrdiff_t(end), body.end());
        std::vector<ExprP> terms;
        int64_t count = 0;
        std::unordered_set<int> set, read, values;   // values: read by the tree, set before it
        accs_set(tree, set);
        accs_read(after, read);
        accs_read(tree, values);
        for (int acc : set) values.erase(acc);
        bool leaks = false;
        for (int acc : set) leaks = leaks || (acc != start.id && read.count(acc));
        if (leaks || !sum_trees(tree, b.extents, terms, count, true, values)) continue;
        Stmt reads_sum{SK::STORE, 0, Op::REDUCE_SUM, DType::FLOAT32, nullptr,
                       ex_acc(start.id, DType::FLOAT32), {}};
        if (single_sum(tree, {reads_sum}) != start.id) continue;
        segments.clear();
        std::vector<const Stmt*> loops;
        for (size_t i = s; i < end; i++) {   // as sum_segments, over body[s, end)
            if (body[i].kind != SK::LOOP) {
                if (is_term(body[i])) return 0;   // a term outside the loops: not such a tree
                continue;
            }
            loops.push_back(&body[i]);
            sum_segments(body[i].body, b, loops, segments);
            loops.pop_back();
        }
        return end;
    }
    return 0;
}

// Who runs a cooperative item: a block (its threads numbered by threadIdx.x), or a warp (by
// lane), with the reduction and barrier of their size.
struct CooperativeGroup {
    const char *thread, *reduce, *barrier;
    int size;
};
static const CooperativeGroup BLOCK_GROUP{"threadIdx.x", "tg_block_reduce", "__syncthreads()",
                                          CUDA_BLOCK_THREADS};
static const CooperativeGroup WARP_GROUP{"lane", "tg_warp_reduce", "__syncwarp()", 32};
static int64_t terms_each(int64_t terms, const CooperativeGroup& g) {   // a thread's, at most
    return (terms + g.size - 1) / g.size;
}
// the first line of a loop over `terms` terms (variable i<var>) that the group's threads split
static std::string group_loop(const std::string& pad, int var, const CooperativeGroup& g,
                              int64_t terms) {
    return strf("%sfor (int64_t i%d = %s; i%d < %lldLL; i%d += %d) {\n", pad.c_str(), var,
                g.thread, var, (long long)terms, var, g.size);
}

// The body of a cooperative item (see KernelPlan and cooperative_body). Every thread of the
// group runs every statement at this level with the same values, so the barriers in the
// reductions and after each write are reached by all of them; a store is done by thread 0.
static void cooperative_stmts(const Program& p, size_t k, const Block& b,
                              const std::vector<Stmt>& body, std::unordered_map<int, Op>& accs,
                              const CooperativeGroup& g, int depth, int& next_tmp,
                              std::string& out) {
    const std::map<int, std::string> no_arrays;
    std::string pad(size_t(depth) * 4, ' ');
    std::unordered_set<int> zero;   // accumulators that hold 0 since their initialisation
    for (size_t s = 0; s < body.size(); s++) {
        const Stmt& st = body[s];
        std::vector<SumSegment> segments;
        size_t tree_end = sum_tree_at(body, s, b, segments);
        if (tree_end && segments.size() > 1) {   // (one segment: the chain below, the same)
            c_stmts({st}, b.extents, no_arrays, depth, next_tmp, out);
            accs[st.id] = Op::REDUCE_SUM;
            const int l_id = int(b.extents.size());   // a variable of no loop: l
            for (const SumSegment& seg : segments)
                add_term(seg, b, sum_update(st.id), l_id, group_loop(pad, l_id, g, seg.terms),
                         terms_each(seg.terms, g), next_tmp, out, depth);
            out += strf("%sacc%d = %s<0>(acc%d);\n", pad.c_str(), st.id, g.reduce, st.id);
            s = tree_end - 1;
            continue;
        }
        if (st.kind != SK::LOOP) {
            std::string part;
            bool store = st.kind == SK::STORE || st.kind == SK::STORE_ADD;
            c_stmts({st}, b.extents, no_arrays, depth + store, next_tmp, part);
            if (st.kind == SK::ACC_INIT) accs[st.id] = st.op;
            if (st.kind == SK::ACC_INIT && is_const(st.val, 0)) zero.insert(st.id);
            else if (st.kind == SK::ACC_INIT || st.kind == SK::ACC_UPDATE) zero.erase(st.id);
            if (store)
                part = pad + "if (" + g.thread + " == 0) {\n" + part + pad + "}\n" + pad +
                       g.barrier + ";\n";
            out += part;
            continue;
        }
        std::vector<const Stmt*> chain;
        ExprP value;
        int acc = chain_acc(st, chain, value);
        if (acc >= 0) {   // thread l takes the chain's flat iterations l, l + size, ...
            Op op = accs.at(acc);
            int64_t n = 1;
            for (const Stmt* l : chain) n *= b.extents[size_t(l->id)];
            if (op == Op::REDUCE_SUM && !zero.count(acc))   // what it holds: counted once
                out += strf("%sif (%s != 0) acc%d = 0;\n", pad.c_str(), g.thread, acc);
            zero.erase(acc);
            // the chain as one segment of n terms: a row split into loops of 16 for its sum
            // reads its elements one after another
            const int f_id = int(b.extents.size());   // a variable of no loop: f
            Stmt update = chain.back()->body[0];   // the innermost acc op= value, into acc
            update.id = acc;
            SumSegment seg{chain, update.val, nullptr, nullptr, n};
            add_term(seg, b, update, f_id, group_loop(pad, f_id, g, n), terms_each(n, g),
                     next_tmp, out, depth);
            out += strf("%sacc%d = %s<%d>(acc%d);\n", pad.c_str(), acc, g.reduce,
                        op == Op::REDUCE_MAX ? 1 : 0, acc);
            continue;
        }
        std::unordered_set<int> updated;
        acc_updates(st.body, updated);
        bool outer = false;
        for (int a : updated) outer = outer || accs.count(a);
        long long n = (long long)b.extents[size_t(st.id)];
        if (outer) {   // every thread runs every iteration; the body cooperates
            out += strf("%sfor (int64_t i%d = 0; i%d < %lldLL; i%d++) {\n", pad.c_str(), st.id,
                        st.id, n, st.id);
            cooperative_stmts(p, k, b, st.body, accs, g, depth + 1, next_tmp, out);
            out += pad + "}\n";
            for (int a : updated) zero.erase(a);
            continue;
        }
        // stores only: split when its iterations write apart (what the item does before and
        // after the loop is apart from it: each ends at a barrier or a reduction)
        Block just_the_loop;
        just_the_loop.body = {st};
        just_the_loop.extents = b.extents;
        std::string loop;
        if (iterations_disjoint(p, k, just_the_loop, st, -1))
            loop = group_loop(pad, st.id, g, n);
        else
            loop = strf("%sif (%s == 0) for (int64_t i%d = 0; i%d < %lldLL; i%d++) {\n",
                        pad.c_str(), g.thread, st.id, st.id, n, st.id);
        c_stmts(st.body, b.extents, no_arrays, depth + 1, next_tmp, loop);
        out += loop + pad + "}\n" + pad + g.barrier + ";\n";
    }
}

std::string cuda_prelude(const std::string& body) {
    std::string out =
        "/* generated by tinygrad.hpp (cuda_backend.hpp) */\n"
        "typedef unsigned char uint8_t;\ntypedef int int32_t;\ntypedef unsigned int uint32_t;\n"
        "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\n"
        "#define INT64_MAX 9223372036854775807LL\n#define INT64_MIN (-INT64_MAX - 1)\n"
        "#define INFINITY __int_as_float(0x7f800000)\n#define NAN __int_as_float(0x7fc00000)\n";
    // a block-wide reduction in a fixed order: within each warp by shuffles (lane l takes lane
    // l + 16, then l + 8, ...), then the warps' results in the first warp the same way; every
    // thread gets the total. A warp's alone: the first step, then lane 0's total to every lane.
    const char* combine =
        "static __device__ __forceinline__ float tg_combine(float a, float b, int max) {\n"
        "    return max ? (a > b || a != a ? a : b) : a + b;\n}\n"
        "static __device__ __forceinline__ double tg_combine(double a, double b, int max) {\n"
        "    return max ? (a > b || a != a ? a : b) : a + b;\n}\n"
        "static __device__ __forceinline__ int32_t tg_combine(int32_t a, int32_t b, int max) {\n"
        "    return max ? (a > b ? a : b) : (int32_t)((uint32_t)a + (uint32_t)b);\n}\n"
        "static __device__ __forceinline__ int64_t tg_combine(int64_t a, int64_t b, int max) {\n"
        "    return max ? (a > b ? a : b) : (int64_t)((uint64_t)a + (uint64_t)b);\n}\n";
    const char* block_reduce =
        "template <int MAX, typename T> static __device__ T tg_block_reduce(T v) {\n"
        "    __shared__ T part[32];\n"
        "    __syncthreads();\n"
        "    for (int o = 16; o > 0; o /= 2)\n"
        "        v = tg_combine(v, __shfl_down_sync(0xffffffffu, v, o), MAX);\n"
        "    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.x < 32) {\n"
        "        const int warps = blockDim.x >> 5;\n"
        "        v = (int)threadIdx.x < warps ? part[threadIdx.x] : MAX ? part[0] : (T)0;\n"
        "        for (int o = 16; o > 0; o /= 2)\n"
        "            v = tg_combine(v, __shfl_down_sync(0xffffffffu, v, o), MAX);\n"
        "        if (threadIdx.x == 0) part[0] = v;\n"
        "    }\n"
        "    __syncthreads();\n"
        "    return part[0];\n"
        "}\n";
    const char* warp_reduce =
        "template <int MAX, typename T> static __device__ T tg_warp_reduce(T v) {\n"
        "    for (int o = 16; o > 0; o /= 2)\n"
        "        v = tg_combine(v, __shfl_down_sync(0xffffffffu, v, o), MAX);\n"
        "    return __shfl_sync(0xffffffffu, v, 0);\n"
        "}\n";
    bool blocks = body.find("tg_block_reduce<") != std::string::npos,
         warps = body.find("tg_warp_reduce<") != std::string::npos;
    if (blocks || warps) out += combine;
    if (blocks) out += block_reduce;
    if (warps) out += warp_reduce;
    // TF32 (a sign, 8 exponent and 10 fraction bits in a float's place): rounded to nearest,
    // ties away from zero, as cvt.rna does; the tensor cores' multiply-add of a 16 x 8 tile over
    // 8 terms (mma.m16n8k8, float32 sums; lane 4g + q holds a = x[g][q], x[g + 8][q],
    // x[g][q + 4], x[g + 8][q + 4], b = y[q][g], y[q + 4][g], and d = rows g and g + 8,
    // columns 2q and 2q + 1). Before sm_80 (and on the CPU stand-in) the same sums from the
    // lanes' values by shuffles, the terms in order.
    const char* tf32 =
        "static __device__ __forceinline__ float tg_tf32(float v) {\n"
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
        "    uint32_t r;\n"
        "    asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(v));\n"
        "    return __uint_as_float(r);\n"
        "#else\n"
        "    uint32_t u = __float_as_uint(v);\n"
        "    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;\n"
        "    return __uint_as_float(u);\n"
        "#endif\n"
        "}\n"
        "static __device__ __forceinline__ void tg_mma_tf32(float &d0, float &d1, float &d2,\n"
        "                                                   float &d3, const float *a,\n"
        "                                                   const float *b) {\n"
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
        "    asm(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, \"\n"
        "        \"{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n"
        "        : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3)\n"
        "        : \"r\"(__float_as_uint(a[0])), \"r\"(__float_as_uint(a[1])),\n"
        "          \"r\"(__float_as_uint(a[2])), \"r\"(__float_as_uint(a[3])),\n"
        "          \"r\"(__float_as_uint(b[0])), \"r\"(__float_as_uint(b[1])));\n"
        "#else\n"
        "    const int g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;\n"
        "    for (int k = 0; k < 8; k++) {\n"
        "        const float x0 = __shfl_sync(0xffffffffu, a[k / 4 * 2], 4 * g + k % 4);\n"
        "        const float x8 = __shfl_sync(0xffffffffu, a[k / 4 * 2 + 1], 4 * g + k % 4);\n"
        "        const float y0 = __shfl_sync(0xffffffffu, b[k / 4], 8 * q + k % 4);\n"
        "        const float y1 = __shfl_sync(0xffffffffu, b[k / 4], 8 * q + 4 + k % 4);\n"
        "        d0 = fmaf(x0, y0, d0);\n        d1 = fmaf(x0, y1, d1);\n"
        "        d2 = fmaf(x8, y0, d2);\n        d3 = fmaf(x8, y1, d3);\n"
        "    }\n"
        "#endif\n"
        "}\n";
    if (body.find("tg_mma_tf32(") != std::string::npos) out += tf32;
    // the first failed check wins; the others leave err alone
    const char* check =
        "static __device__ __forceinline__ int64_t tg_check(int64_t i, int64_t n, int site,\n"
        "                                                   int64_t *err) {\n"
        "    if (i >= 0 && i < n) return i;\n"
        "    if (atomicCAS((unsigned long long *)err, 0ull, (unsigned long long)(site + 1)) "
        "== 0ull)\n        err[1] = i;\n"
        "    return 0;\n"
        "}\n";
    // integer max as a call: ptxas of CUDA 13.0 at -O1 and above (sm_90) drops the negations
    // of max(-a, max(-b, ...)), an integer min's loop (tests/test_cuda.cpp), which it cannot
    // see through a call
    const char* imax = "static __device__ __noinline__ int64_t tg_imax(int64_t a, int64_t b) {\n"
                       "    return a > b ? a : b;\n}\n";
    for (auto& [name, code] : C_HELPERS) {
        if (body.find(name) == std::string::npos) continue;
        if (std::string(name) == "tg_check(") { out += check; continue; }
        if (std::string(name) == "tg_imax(") { out += imax; continue; }
        std::string c = code;
        for (size_t at; (at = c.find("static inline")) != std::string::npos;)
            c.replace(at, 13, "static __device__ __forceinline__");
        out += c;
    }
    return out;
}

// idx as base + c·l, l the number of an iteration of `loops` (outermost first, the innermost
// counting by one), where idx reads their variables only so. c is the first c found where
// c_known is false (it stays false where no loop is read).
static bool by_iteration(const ExprP& idx, const std::vector<const Stmt*>& loops, const Block& b,
                         int64_t& c, bool& c_known, Linear& base) {
    base = Linear{};
    base.add(1, idx);
    int64_t stride = 1;   // of the loop in the iteration's number
    for (size_t i = loops.size(); i-- > 0;) {
        int id = loops[i]->id;
        int64_t coef = 0;
        for (auto t = base.terms.begin(); t != base.terms.end(); ++t)
            if (t->second->kind == EK::VAR && t->second->id == id) {
                coef = t->first;
                base.terms.erase(t);
                break;
            }
        if (!c_known && coef % stride == 0) {
            c = coef / stride;
            c_known = true;
        }
        if (coef != c * stride) return false;
        stride *= b.extents[size_t(id)];
    }
    for (auto& [coef, term] : base.terms)
        for (const Stmt* loop : loops)
            if (uses_var(term, loop->id)) return false;
    return true;
}

static ExprP plus_multiple(Linear base, int64_t c, const ExprP& var) {   // base + c·var
    if (c) base.terms.push_back({c, var});
    return base.build();
}

// An operand as one load at base + c·f, f the term's number, where each segment reads it so
// (the lowering splits a sum's axis into loops: k = 16·i3 + i4 for the first 256 terms, then
// 256 + 16·i5 + i6, ...): the tiles then read it without the segments' divisions and
// branches. f_var stands for f; null where the operand is not such a load.
static ExprP load_by_term(const Block& b, const ProductPlan& plan, bool x, const ExprP& f_var) {
    const ExprP& e0 = x ? plan.segments[0].x : plan.segments[0].y;
    if (e0->kind != EK::LOAD) return nullptr;
    int64_t c = 0, first = 0;
    bool c_known = false;
    Linear base;
    for (size_t s = 0; s < plan.segments.size(); s++) {
        const SumSegment& seg = plan.segments[s];
        const ExprP& e = x ? seg.x : seg.y;
        Linear lin;
        if (e->kind != EK::LOAD || e->id != e0->id ||
            !by_iteration(e->src[0], seg.loops, b, c, c_known, lin))
            return nullptr;
        lin.constant -= c * first;
        first += seg.terms;
        if (s == 0) {
            base = lin;
            continue;
        }
        if (lin.constant != base.constant || lin.terms.size() != base.terms.size()) return nullptr;
        for (size_t t = 0; t < lin.terms.size(); t++)
            if (lin.terms[t].first != base.terms[t].first ||
                !expr_eq(lin.terms[t].second, base.terms[t].second))
                return nullptr;
    }
    return ex_load(e0->id, e0->dtype, plus_multiple(base, c, f_var));
}

// e, an expression of a segment's term, with each load read at base + c·l (l_var: the number
// of the segment's iteration; c by load) in place of its loops' variables; null where it reads
// them otherwise.
static ExprP by_iteration_of(const ExprP& e0, const SumSegment& seg, const Block& b,
                             const ExprP& l_var) {
    bool fits = true;
    Rewritten done;
    ExprP out = substitute(
        e0,
        [&](const ExprP& e) -> ExprP {
            if (e->kind == EK::VAR)
                for (const Stmt* l : seg.loops) fits = fits && l->id != e->id;
            int64_t c = 0;
            bool c_known = false;
            Linear base;
            if (e->kind != EK::LOAD || !by_iteration(e->src[0], seg.loops, b, c, c_known, base))
                return nullptr;
            return ex_load(e->id, e->dtype, plus_multiple(base, c, l_var));
        },
        done);
    return fits ? out : nullptr;
}
static ExprP term_by_iteration(const SumSegment& seg, const Block& b, const ExprP& l_var) {
    return by_iteration_of(seg.term, seg, b, l_var);
}

// An operand with its loads read at base + c·f, f the term's number: one load that every
// segment reads so (load_by_term), or, in a sum of one segment, an expression whose loads each
// read so (c by load: a head's slice of a row plus its bias). Null where not.
static ExprP operand_by_term(const Block& b, const ProductPlan& plan, bool x, const ExprP& f_var) {
    if (ExprP load = load_by_term(b, plan, x, f_var)) return load;
    if (plan.segments.size() != 1) return nullptr;
    const SumSegment& seg = plan.segments[0];
    return by_iteration_of(x ? seg.x : seg.y, seg, b, f_var);
}

// The variables of a segment's loops, declared from `number` (its iteration's number).
static std::string segment_vars(const SumSegment& seg, const Block& b, const std::string& number,
                                const std::string& pad) {
    std::string code = pad + "int64_t l = " + number + ";\n";
    for (size_t i = seg.loops.size(); i-- > 0;) {
        int id = seg.loops[i]->id;
        long long e = (long long)b.extents[size_t(id)];
        code += pad + strf("int64_t i%d = l %% %lldLL;\n", id, e) + pad + strf("l /= %lldLL;\n", e);
    }
    return code + pad + "(void)l;\n";
}

// A float sum of more terms than this one after another carries what each addition lost
// into the next (Kahan's compensated sum: compensated_add, after `float tg_lost = 0.0f;`).
static const int64_t COMPENSATED_SUM_TERMS = 16;
static std::string compensated_add(const std::string& acc, const std::string& term,
                                   const std::string& pad) {
    return strf("%sconst float tg_y = %s - tg_lost, tg_t = %s + tg_y;\n"
                "%stg_lost = (tg_t - %s) - tg_y;\n%s%s = tg_t;\n",
                pad.c_str(), term.c_str(), acc.c_str(), pad.c_str(), acc.c_str(), pad.c_str(),
                acc.c_str());
}

// The totals of split sums: `acc`, the partial sums of element `at` over the ranges, added in
// the ranges' order from the scratch buffer (ranges x outputs floats), read from L2 (another
// multiprocessor wrote them in this kernel: L1 is not kept coherent); `acc` declared here
// unless `declared`. Unrolled, so that the loads are in flight together (the adds wait in
// order).
static std::string sum_of_ranges(const std::string& acc, int64_t ranges, int64_t outputs,
                                 const char* at, const std::string& pad = "    ",
                                 bool declared = false) {
    std::string part = strf("__ldcg(&tg_part[s * %lldLL + %s])", (long long)outputs, at);
    std::string out = pad + (declared ? "" : "float ") + acc + " = 0.0f;\n";
    std::string loop = strf("#pragma unroll 16\n%sfor (int64_t s = 0; s < %lldLL; s++)",
                            pad.c_str(), (long long)ranges);
    if (ranges <= COMPENSATED_SUM_TERMS)
        return out + loop + " " + acc + " += " + part + ";\n";
    return out + pad + "{\n" + pad + "float tg_lost = 0.0f;\n" + loop + " {\n" +
           compensated_add(acc, part, pad + "    ") + pad + "}\n" + pad + "}\n";
}

// The end of a range of a split product or cooperative sum (a block per range of a tile or
// item: by_block) or column sum (a thread per range of a column), its partial sums written:
// only the range of its tile, item or column `group` that finishes last goes on, to add the
// group's ranges. It counts arrivals in a counter per group, after the partial sums in
// scratch: zeroed when allocated, and set back to 0 by the last, for the next run. Which range
// comes last varies; the order of the sum does not (sum_of_ranges), so neither do its bits.
// The fence before the count makes this range's sums visible to whichever adds them; the one
// after orders that range's reads. Every range arrives: a split sum tests no bounds
// (match_product and match_sum take no checks), nor does a launch beside a nest that writes
// in place, so where such a nest stops at the start for an earlier failed check, all its
// blocks stop.
static std::string last_range_goes_on(int64_t ranges, int64_t outputs, const char* group,
                                      bool by_block) {
    std::string arrived = strf("(unsigned *)(tg_part + %lldLL) + %s",
                               (long long)(ranges * outputs), group);
    if (!by_block)
        return strf("    __threadfence();\n"
                    "    {\n        unsigned *arrived = %s;\n"
                    "        if (atomicAdd(arrived, 1u) != %lldu) return;\n"
                    "        *arrived = 0u;\n    }\n    __threadfence();\n",
                    arrived.c_str(), (long long)(ranges - 1));
    return strf("    __threadfence();\n    __syncthreads();\n    __shared__ bool arrived_last;\n"
                "    if (threadIdx.x == 0) {\n        unsigned *arrived = %s;\n"
                "        arrived_last = atomicAdd(arrived, 1u) == %lldu;\n"
                "        if (arrived_last) *arrived = 0u;\n    }\n"
                "    __syncthreads();\n    if (!arrived_last) return;\n    __threadfence();\n",
                arrived.c_str(), (long long)(ranges - 1));
}

// Whether idx moves one element with var and lies on a multiple of V wherever var does.
static bool vector_index(const ExprP& idx, int var, int V) {
    if (!steps_by_one(idx, var)) return false;
    Linear lin;
    lin.add(1, idx);
    bool aligned = lin.constant % V == 0;
    for (auto& [coef, term] : lin.terms)
        aligned = aligned && (coef % V == 0 || (term->kind == EK::VAR && term->id == var));
    return aligned;
}

// The stores of a product's epilogue that a thread makes for V consecutive columns at once
// (a group, its first column a multiple of V), as one vector store after the group: float
// stores that move one element with the column and start on a multiple of V, of a buffer the
// epilogue stores nowhere else and does not read. A warp's vector store writes whole 128-byte
// lines of 4 rows, where each of V scalar stores wrote one float in 16 bytes of them (W7's
// Linear with its GELU stores 5 outputs of 8192 x 2048). Loads stay scalar: a vector load
// held for its group took W7's projections past 128 registers, and the scalar loads of a
// group's columns read lines that L1 holds.
static std::vector<bool> vector_stores(const std::vector<Stmt>& epilogue, int col, int V) {
    std::map<int, int> stores;   // by buffer
    std::set<int> read;
    ExprSet seen;
    for (const Stmt& st : epilogue) {
        if (st.kind == SK::LOOP) return {};
        if (st.kind == SK::STORE || st.kind == SK::STORE_ADD) stores[st.id]++;
        for (const ExprP& e : {st.idx, st.val})
            if (e)
                each_part(e, seen, [&](const ExprP& part) {
                    if (part->kind == EK::LOAD) read.insert(part->id);
                });
    }
    std::vector<bool> vectors;
    for (const Stmt& st : epilogue)
        vectors.push_back(st.kind == SK::STORE && st.val->dtype == DType::FLOAT32 &&
                          stores[st.id] == 1 && !read.count(st.id) &&
                          vector_index(st.idx, col, V));
    return vectors;
}

// A whole product's epilogue with vector stores (vector_stores) for each row a and column
// group v of a thread: the epilogue for each of the group's V columns q, the values of vector
// stores kept in registers, then those stores.
static std::string vector_epilogue(const Block& b, const ProductPlan& plan,
                                   const std::vector<bool>& vectors, const std::string& row,
                                   int& next_tmp) {
    const ProductMatch& m = plan.match;
    const int T = plan.tile, R = T / 16, V = std::min(R, 4);
    const std::string group = strf("i%dg", m.cols), pad(12, ' ');
    std::string out = strf("#pragma unroll\n    for (int a = 0; a < %d; a++)\n"
                           "#pragma unroll\n        for (int v = 0; v < %d; v++) {\n", R, R / V);
    out += strf("%sconst int64_t i%d = r0 + %s, %s = c0 + %d * tx + %d * v;\n", pad.c_str(),
                m.rows, row.c_str(), group.c_str(), V, 16 * V);
    if (plan.rows % T || plan.cols % T)
        out += strf("%sif (i%d >= %lldLL || %s >= %lldLL) continue;\n", pad.c_str(), m.rows,
                    (long long)plan.rows, group.c_str(), (long long)plan.cols);
    for (size_t s = 0; s < vectors.size(); s++)
        if (vectors[s]) out += strf("%sfloat s%zu[%d];\n", pad.c_str(), s, V);
    out += strf("#pragma unroll\n%sfor (int q = 0; q < %d; q++) {\n", pad.c_str(), V);
    out += strf("%s    const int64_t i%d = %s + q;\n", pad.c_str(), m.cols, group.c_str());
    out += strf("%s    float acc%d = sum[a][%d * v + q];\n", pad.c_str(), plan.sum, V);
    for (size_t s = 0; s < vectors.size(); s++) {
        const Stmt& st = m.epilogue[s];
        if (!vectors[s]) {
            c_stmts({st}, b.extents, {}, 4, next_tmp, out);
            continue;
        }
        CExprs cx{{}, next_tmp};
        out += cx.declare_shared({st.val}, pad + "    ");
        out += strf("%s    s%zu[q] = %s;\n", pad.c_str(), s, cx.str(st.val).c_str());
    }
    out += pad + "}\n";
    for (size_t s = 0; s < vectors.size(); s++) {
        if (!vectors[s]) continue;
        const ExprP& idx = m.epilogue[s].idx;
        CExprs cx{{}, next_tmp};   // the index with the column written as the group's first
        cx.name_var(idx, m.cols, group);
        out += cx.declare_shared({idx}, pad);
        std::string values;
        for (int q = 0; q < V; q++) values += strf("%ss%zu[%d]", q ? ", " : "", s, q);
        out += strf("%s*(float%d *)&buf%d[%s] = make_float%d(%s);\n", pad.c_str(), V,
                    m.epilogue[s].id, cx.str(idx).c_str(), V, values.c_str());
    }
    return out + "        }\n";
}

// The body of a product's kernel (see ProductPlan): stage 0 the whole product, 1 a split one (a
// block per tile and range of terms, its partial sums into tg_part; the tile's last range to
// finish adds each output's ranges in order and runs the epilogue). Threads load the tiles'
// terms so that neighbours read neighbouring addresses where an operand lies along the rows
// (x) or columns (y); a term past the range, or a row or column past the end, is 0.
static std::string render_product(const Block& b, int stage, const char* block,
                                  int& next_tmp) {
    ProductPlan plan;
    if (!plan_product(b, plan)) fail("render: a nest planned as a product is no longer one");
    const ProductMatch& m = plan.match;
    const int T = plan.tile, KT = CUDA_TILE_TERMS, R = T / 16;   // 16 x 16 threads, R x R each
    const int P = staged_row(plan);
    long long M = plan.rows, N = plan.cols, K = plan.terms;
    long long outputs = plan.outer * M * N;
    // the outer loops' variables from t, the flat number of their iteration
    auto outer_vars = [&](const char* pad) {
        std::string code;
        for (size_t l = m.loops.size(); l-- > 0;) {
            int v = m.loops[l];
            if (v == m.rows || v == m.cols) continue;
            long long n = (long long)b.extents[size_t(v)];
            code += strf("%sconst int64_t i%d = t %% %lldLL;\n%st /= %lldLL;\n", pad, v, n, pad, n);
        }
        return code;
    };
    long long row_tiles = (M + T - 1) / T, col_tiles = (N + T - 1) / T;
    // two buffers of each operand's terms: one read while the next terms are stored in the
    // other, in the kernel's tg_tiles (staged_floats(plan) floats)
    std::string out = strf("    float (*const xs)[%d][%d] = (float (*)[%d][%d])tg_tiles;\n"
                           "    float (*const ys)[%d][%d] = (float (*)[%d][%d])(tg_tiles + %d);\n",
                           KT, P, KT, P, KT, P, KT, P, 2 * KT * P);
    out += strf("    int64_t t = %s;\n", block);
    std::string k_begin = "0LL", k_end = strf("%lldLL", K);
    if (stage == 1) {
        long long each = plan.split_terms;
        out += strf("    const int64_t split = t %% %lldLL, k_begin = split * %lldLL;\n"
                    "    t /= %lldLL;\n    const int64_t tile = t;\n"
                    "    const int64_t k_end = k_begin + %lldLL < %lldLL ? k_begin + %lldLL : "
                    "%lldLL;\n",
                    (long long)plan.splits, each, (long long)plan.splits, each, K, each, K);
        k_begin = "k_begin";
        k_end = "k_end";
    }
    out += strf("    const int64_t r0 = t %% %lldLL * %d;\n    t /= %lldLL;\n"
                "    const int64_t c0 = t %% %lldLL * %d;\n    t /= %lldLL;\n",
                row_tiles, T, row_tiles, col_tiles, T, col_tiles);
    out += "    const int64_t outer = t;\n    (void)outer;\n";
    out += outer_vars("    ");
    // a thread's rows are V·ty + 16·V·j + q (q < V, j < R / V), its columns the same with tx:
    // V consecutive values, read from shared memory in one vector load. A warp is 4 values of
    // ty by 8 of tx: its vector loads of a term read 4 vectors of x and 8 of y, at most 128
    // bytes each, one pass of shared memory (2 by 16 took two passes for y, where a 64 x 64
    // tile's 16 multiply-adds a term leave shared memory little time). On tensor cores, the 8
    // warps take 2 x 4 parts of the tile, each F x F tiles of 16 rows by 8 columns (F = T / 32),
    // that PTX's mma.m16n8k8 computes: lane 4g + q holds rows g and g + 8, columns 2q and 2q + 1
    // of each; sum[2i + h][2j + w] is its row g + 8h and column 2q + w of tile (i, j).
    const int V = std::min(R, 4), F = T / 32;
    const std::string vec = strf("float%d", V);
    if (plan.tf32)
        out += strf("    const int warp = threadIdx.x / 32, g = threadIdx.x %% 32 / 4, "
                    "q = threadIdx.x %% 4;\n"
                    "    const int wr = warp / 4 * %d, wc = warp %% 4 * %d;\n",
                    T / 2, T / 4);
    else
        out += "    const int tx = threadIdx.x / 32 % 2 * 8 + threadIdx.x % 8,\n"
               "              ty = threadIdx.x / 64 * 4 + threadIdx.x % 32 / 8;\n";
    out += strf("    float sum[%d][%d];\n"
                "    for (int a = 0; a < %d; a++)\n"
                "        for (int c = 0; c < %d; c++) sum[a][c] = 0.0f;\n",
                R, R, R, R);
    // an operand's value for term f (the segment's loops from it), in `to`
    const int f_id = int(b.extents.size());   // a variable of no loop: f
    ExprP f_var = ex_var(f_id);
    auto operand = [&](bool x, const std::string& to, const std::string& pad) {
        std::string code;
        if (ExprP e = operand_by_term(b, plan, x, f_var)) {
            CExprs cx{{{f_var.get(), "f"}}, next_tmp};
            code += cx.declare_shared({e}, pad);
            return code + pad + to + " = " + cx.str(e) + ";\n";
        }
        int64_t first = 0;
        for (size_t s = 0; s < plan.segments.size(); s++) {
            const SumSegment& seg = plan.segments[s];
            bool last = s + 1 == plan.segments.size();
            code += pad + (s ? "} else " : "") +
                    (last ? "{\n" : strf("if (f < %lldLL) {\n", (long long)(first + seg.terms)));
            code += segment_vars(seg, b, strf("f - %lldLL", (long long)first), pad + "    ");
            CExprs cx{{}, next_tmp};
            const ExprP& e = x ? seg.x : seg.y;
            code += cx.declare_shared({e}, pad + "    ");
            code += pad + "    " + to + " = " + cx.str(e) + ";\n";
            first += seg.terms;
        }
        return code + pad + "}\n";
    };
    const SumSegment& first = plan.segments[0];
    int inner = first.loops.empty() ? -1 : first.loops.back()->id;
    bool x_by_rows = read_along(first.x, m.rows) && (inner < 0 || !read_along(first.x, inner));
    bool y_by_cols = read_along(first.y, m.cols) || inner < 0 || !read_along(first.y, inner);
    // Each thread stages L of each operand's T·KT values of the terms from k0: element e =
    // threadIdx.x + 256·l of the tile. `fetch` loads them from memory into xn and yn, `put`
    // stores them into shared buffer `buffer`: the loads of the next terms are issued before
    // the products of these, and stored after them.
    const int L = T * KT / CUDA_BLOCK_THREADS;
    auto element = [&](bool x, const std::string& pad) {
        bool along = x ? x_by_rows : y_by_cols;
        return pad + strf("const int e = threadIdx.x + %d * l;\n", CUDA_BLOCK_THREADS) + pad +
               (along ? strf("const int o = e %% %d, kk = e / %d;\n", T, T)
                      : strf("const int o = e / %d, kk = e %% %d;\n", KT, KT));
    };
    // and its row (or column) and term, the step's terms from k0
    auto element_at = [&](bool x, const std::string& k0, const std::string& pad) {
        return element(x, pad) + pad + strf("const int64_t i%d = %s + o, f = %s + kk;\n",
                                            x ? m.rows : m.cols, x ? "r0" : "c0", k0.c_str());
    };
    // every step of KT terms lies inside the sum (or the range: split_terms is a multiple of KT)
    const bool whole_steps = K % KT == 0;
    // An operand whose loads are float loads at a·i + c·f + base each (i its row or column: one
    // load, or a head's slice of a row plus its bias), with no bounds to test, is read through
    // a pointer per load to the thread's first element: element l lies a fixed distance further
    // (e grows by 256: kk by 256/T, or o by 256/KT), and each step moves it c·KT on, so that no
    // index is computed in the loop. by_pointer[x]: the operand with load k read as
    // xpk[l * each] (or ypk), for the fetch.
    struct PointerLoad {
        ExprP load;
        long long each, step;
    };
    std::vector<long long> pointer_steps[2];   // by load
    std::string by_pointer[2];
    std::string pointers;
    for (int x = 1; x >= 0; x--) {
        int var = x ? m.rows : m.cols;
        ExprP e = operand_by_term(b, plan, x, f_var);
        if (!e || e->dtype != DType::FLOAT32 || !whole_steps || (x ? M : N) % T) continue;
        bool along = x ? x_by_rows : y_by_cols, fits = true;
        std::vector<PointerLoad> loads;
        Rewritten done;   // the operand with its loads as constants: it reads i and f no other way
        ExprP rest = substitute(
            e,
            [&](const ExprP& part) -> ExprP {
                if (part->kind != EK::LOAD) return nullptr;
                int64_t a, c;
                fits = fits && part->dtype == DType::FLOAT32 &&
                       step_along(part->src[0], var, a) && step_along(part->src[0], f_id, c);
                if (fits)
                    loads.push_back({part, along ? c * (CUDA_BLOCK_THREADS / T)
                                                 : a * (CUDA_BLOCK_THREADS / KT), c * KT});
                return ex_const(0, part->dtype);
            },
            done);
        if (!fits || uses_var(rest, var) || uses_var(rest, f_id)) continue;
        CExprs named{{}, next_tmp};
        for (size_t k = 0; k < loads.size(); k++) {
            std::string p = strf("%s%zu", x ? "xp" : "yp", k);
            CExprs cx{{{f_var.get(), "f"}}, next_tmp};
            pointers += strf("    const float *%s;\n    {\n        const int l = 0;\n", p.c_str()) +
                        element_at(x, k_begin, "        ") +
                        cx.declare_shared({loads[k].load}, "        ") +
                        strf("        %s = &%s;\n    }\n", p.c_str(),
                             cx.str(loads[k].load).c_str());
            named.names[loads[k].load.get()] = strf("%s[l * %lldLL]", p.c_str(), loads[k].each);
        }
        by_pointer[x] = named.str(e);
        for (const PointerLoad& load : loads) pointer_steps[x].push_back(load.step);
    }
    // An operand of one float load, with no bound to test, whose thread's elements lie a fixed
    // distance apart however the index moves with the term (a head's slice of a row, a
    // permuted layout), is read through a pointer to its first element that each step
    // computes, so that one index a step is computed, not L. Read across (kk = e % KT: the
    // elements share their term), the index must move by a·i with the row or column i: they
    // lie a·256/KT apart. Read along (o = e % T: they share their row or column, their terms
    // 256/T apart), it must move by a·j with the innermost loop j of the sum, whose length is
    // a multiple of KT (so a step's terms differ in j alone): they lie a·256/T apart (the
    // attention output's layout in its projection's weight gradient).
    ExprP step_load[2];
    long long step_each[2] = {0, 0};
    for (int x = 1; x >= 0; x--) {
        int var = x ? m.rows : m.cols;
        bool along = x ? x_by_rows : y_by_cols;
        if (!by_pointer[x].empty() || !whole_steps || (x ? M : N) % T ||
            plan.segments.size() != 1)
            continue;
        ExprP load = x ? first.x : first.y;
        if (load->kind != EK::LOAD || load->dtype != DType::FLOAT32) continue;
        int64_t a;
        if (!along && step_along(load->src[0], var, a))
            step_each[x] = a * (CUDA_BLOCK_THREADS / KT);
        else if (along && inner >= 0 && b.extents[size_t(inner)] % KT == 0 &&
                 step_along(load->src[0], inner, a))
            step_each[x] = a * (CUDA_BLOCK_THREADS / T);
        else continue;
        step_load[x] = load;
    }
    auto fetch = [&](const std::string& k0, const std::string& pad) {
        std::string code;
        for (int x = 1; x >= 0; x--) {   // x's terms, then y's
            int var = x ? m.rows : m.cols;
            long long n = x ? M : N;
            const char* p = x ? "xp" : "yp";
            if (step_load[x]) {
                CExprs cx{{}, next_tmp};
                code += pad + "{\n" + pad + "    const float *p;\n" + pad + "    {\n" + pad +
                        "        const int l = 0;\n" + element_at(x, k0, pad + "        ") +
                        pad + "        {\n" + segment_vars(first, b, "f", pad + "            ") +
                        cx.declare_shared({step_load[x]}, pad + "            ") + pad +
                        strf("            p = &%s;\n", cx.str(step_load[x]).c_str()) + pad +
                        "        }\n" + pad + "    }\n" + pad + "    #pragma unroll\n" + pad +
                        strf("    for (int l = 0; l < %d; l++) %s[l] = p[l * %lldLL];\n", L,
                             x ? "xn" : "yn", step_each[x]) +
                        pad + "}\n";
                continue;
            }
            code += pad + "#pragma unroll\n" + pad + strf("for (int l = 0; l < %d; l++) {\n", L);
            if (!by_pointer[x].empty()) {
                code += pad + strf("    %s[l] = %s;\n", x ? "xn" : "yn", by_pointer[x].c_str()) +
                        pad + "}\n";
                for (size_t k = 0; k < pointer_steps[x].size(); k++)
                    code += pad + strf("%s%zu += %lldLL;\n", p, k, pointer_steps[x][k]);
                continue;
            }
            code += element_at(x, k0, pad + "    ");
            std::string inside;   // the bounds that a partial tile or step can pass
            if (n % T) inside = strf("i%d < %lldLL", var, n);
            if (!whole_steps) inside += (inside.empty() ? "f < " : " && f < ") + k_end;
            if (inside.empty()) {
                code += pad + "    float v;\n" + operand(x, "v", pad + "    ");
            } else {
                code += pad + "    float v = 0.0f;\n" + pad + "    if (" + inside + ") {\n";
                code += operand(x, "v", pad + "        ") + pad + "    }\n";
            }
            code += pad + strf("    %s[l] = v;\n", x ? "xn" : "yn") + pad + "}\n";
        }
        return code;
    };
    // Element l of an operand lies at a fixed distance from element 0 in the buffer (kk grows
    // by 256/T, or o by 256/KT): xat and yat, element 0's place, are computed once.
    std::string places;
    int place_each[2];
    for (int x = 1; x >= 0; x--) {
        bool along = x ? x_by_rows : y_by_cols;
        place_each[x] = along ? CUDA_BLOCK_THREADS / T * P : CUDA_BLOCK_THREADS / KT;
        places += strf("    int %s;\n    {\n        const int l = 0;\n", x ? "xat" : "yat") +
                  element(x, "        ") +
                  strf("        %s = kk * %d + o;\n    }\n", x ? "xat" : "yat", P);
    }
    auto put = [&](const char* buffer, const std::string& pad) {
        std::string code;
        for (int x = 1; x >= 0; x--) {
            // on tensor cores, rounded to TF32 once here rather than at each read
            std::string v = strf(plan.tf32 ? "tg_tf32(%s[l])" : "%s[l]", x ? "xn" : "yn");
            code += pad + "#pragma unroll\n" + pad + strf("for (int l = 0; l < %d; l++)\n", L) +
                    pad + strf("    (&%s[%s][0][0])[%s + %d * l] = %s;\n", x ? "xs" : "ys",
                               buffer, x ? "xat" : "yat", place_each[x], v.c_str());
        }
        return code;
    };
    out += pointers + places + strf("    float xn[%d], yn[%d];\n", L, L);
    out += fetch(k_begin, "    ") + put("0", "    ") + "    __syncthreads();\n";
    out += strf("    int buffer = 0;\n"
                "    for (int64_t k0 = %s; k0 < %s; k0 += %d, buffer ^= 1) {\n"
                "        const bool more = k0 + %d < %s;\n        if (more) {\n",
                k_begin.c_str(), k_end.c_str(), KT, KT, k_end.c_str());
    out += fetch("k0 + " + std::to_string(KT), "            ") + "        }\n";
    // the terms' loop unrolled, so that the shared reads are one base register and offsets
    out += strf("        const float (*xb)[%d] = xs[buffer], (*yb)[%d] = ys[buffer];\n", P, P);
    if (plan.tf32) {   // 8 terms at a time: each warp's F x F tiles, from F of each operand
        out += strf("#pragma unroll\n        for (int kk = 0; kk < %d; kk += 8) {\n"
                    "            float xf[%d][4], yf[%d][2];\n"
                    "#pragma unroll\n            for (int i = 0; i < %d; i++) {\n"
                    "                const int r = wr + 16 * i + g;\n"
                    "                xf[i][0] = xb[kk + q][r];\n"
                    "                xf[i][1] = xb[kk + q][r + 8];\n"
                    "                xf[i][2] = xb[kk + q + 4][r];\n"
                    "                xf[i][3] = xb[kk + q + 4][r + 8];\n"
                    "            }\n"
                    "#pragma unroll\n            for (int j = 0; j < %d; j++) {\n"
                    "                const int c = wc + 8 * j + g;\n"
                    "                yf[j][0] = yb[kk + q][c];\n"
                    "                yf[j][1] = yb[kk + q + 4][c];\n"
                    "            }\n"
                    "#pragma unroll\n            for (int i = 0; i < %d; i++)\n"
                    "#pragma unroll\n                for (int j = 0; j < %d; j++)\n"
                    "                    tg_mma_tf32(sum[2 * i][2 * j], sum[2 * i][2 * j + 1], "
                    "sum[2 * i + 1][2 * j],\n"
                    "                                sum[2 * i + 1][2 * j + 1], xf[i], yf[j]);\n"
                    "        }\n",
                    KT, F, F, F, F, F, F);
    } else {
        out += strf("#pragma unroll\n        for (int kk = 0; kk < %d; kk++) {\n", KT);
        out += strf("            float xv[%d], yv[%d];\n", R, R);
        for (int x = 1; x >= 0; x--) {
            const char* w = x ? "xv" : "yv";
            out += strf("#pragma unroll\n            for (int j = 0; j < %d; j++) {\n", R / V);
            out += strf("                const %s v = *(const %s *)&%s[kk][%d * %s + %d * j];\n",
                        vec.c_str(), vec.c_str(), x ? "xb" : "yb", V, x ? "ty" : "tx", 16 * V);
            for (int q = 0; q < V; q++)
                out += strf("                %s[%d * j + %d] = v.%c;\n", w, V, q, "xyzw"[q]);
            out += "            }\n";
        }
        out += strf("#pragma unroll\n            for (int a = 0; a < %d; a++)\n"
                    "#pragma unroll\n                for (int c = 0; c < %d; c++)\n"
                    "                    sum[a][c] = fmaf(xv[a], yv[c], sum[a][c]);\n"
                    "        }\n", R, R);
    }
    // the other buffer was last read before the barrier that ended the previous terms
    out += "        if (more) {\n" + put("buffer ^ 1", "            ") +
           "        }\n        __syncthreads();\n    }\n";
    auto place = [&](const char* axis, const char* index) {   // a thread's row or column
        return strf("%d * %s + %d * (%s / %d) + %s %% %d", V, axis, 16 * V, index, V, index, V);
    };
    std::string row = plan.tf32 ? "wr + 16 * (a / 2) + 8 * (a % 2) + g" : place("ty", "a");
    std::string col = plan.tf32 ? "wc + 8 * (c / 2) + 2 * q + c % 2" : place("tx", "c");
    // Every buffer a kernel writes starts 16-byte aligned: cuMemAlloc aligns to 256 bytes, the
    // arena's temporaries lie at multiples of 64, and an assignment to a view (graph_shrink's
    // rows, at any offset) writes a copy of it (Tensor::assign).
    if (!plan.tf32 && stage != 1 && N % V == 0) {
        std::vector<bool> vectors = vector_stores(m.epilogue, m.cols, V);
        if (std::find(vectors.begin(), vectors.end(), true) != vectors.end())
            return out + vector_epilogue(b, plan, vectors, row, next_tmp);
    }
    // unrolled, so that sum stays in registers: a loop that indexes it puts it in local memory
    // (a GELU's epilogue, which NVRTC would not unroll unasked)
    out += strf("#pragma unroll\n    for (int a = 0; a < %d; a++)\n"
                "#pragma unroll\n        for (int c = 0; c < %d; c++) {\n", R, R);
    out += strf("            const int64_t i%d = r0 + %s, i%d = c0 + %s;\n", m.rows, row.c_str(),
                m.cols, col.c_str());
    if (M % T || N % T)
        out += strf("            if (i%d >= %lldLL || i%d >= %lldLL) continue;\n", m.rows, M,
                    m.cols, N);
    // The partial sums; then the last range's threads add the tile's outputs, each thread 4 at
    // once, so that their loads are in flight together (a thread adds T·T/256 outputs: 64, of
    // 16 ranges each, in W7's weight gradients of 512 x 512), each output's ranges in order.
    if (stage == 1) {
        out += strf("            tg_part[split * %lldLL + (outer * %lldLL + i%d) * %lldLL + i%d] = "
                    "sum[a][c];\n        }\n",
                    outputs, M, m.rows, N, m.cols);
        out += last_range_goes_on(plan.splits, outputs, "tile", true);
        const int U = 4, TH = CUDA_BLOCK_THREADS;   // T·T is a multiple of U·TH
        auto output = [&](const char* pad) {   // output o0 + TH·u's row and column
            return strf("%sconst int o = o0 + %d * u;\n"
                        "%sconst int64_t i%d = r0 + o / %d, i%d = c0 + o %% %d;\n",
                        pad, TH, pad, m.rows, T, m.cols, T);
        };
        std::string inside = M % T || N % T ? strf("i%d < %lldLL && i%d < %lldLL", m.rows, M,
                                                   m.cols, N)
                                            : "";
        out += strf("    for (int o0 = threadIdx.x; o0 < %d; o0 += %d) {\n"
                    "        float total[%d];\n        int64_t at[%d];\n"
                    "#pragma unroll\n        for (int u = 0; u < %d; u++) {\n",
                    T * T, U * TH, U, U, U);
        out += output("            ") + "            total[u] = 0.0f;\n";
        std::string at = strf("(outer * %lldLL + i%d) * %lldLL + i%d", M, m.rows, N, m.cols);
        if (!inside.empty()) at = inside + " ? " + at + " : 0";   // outside: read, not used
        out += "            at[u] = " + at + ";\n        }\n";
        out += strf("#pragma unroll 16\n        for (int64_t s = 0; s < %lldLL; s++)\n"
                    "#pragma unroll\n            for (int u = 0; u < %d; u++) "
                    "total[u] += __ldcg(&tg_part[s * %lldLL + at[u]]);\n",
                    (long long)plan.splits, U, outputs);
        out += strf("#pragma unroll\n        for (int u = 0; u < %d; u++) {\n", U);
        out += output("            ");
        if (!inside.empty()) out += "            if (!(" + inside + ")) continue;\n";
        out += strf("            float acc%d = total[u];\n", plan.sum);
        c_stmts(m.epilogue, b.extents, {}, 3, next_tmp, out);
        return out + "        }\n    }\n";
    }
    out += strf("            float acc%d = sum[a][c];\n", plan.sum);
    c_stmts(m.epilogue, b.extents, {}, 3, next_tmp, out);
    out += "        }\n";
    return out;
}

// A loop over a segment's terms (`loop`, its first line; l: variable l_id) that does `update`
// (acc op= the term) with each, the term's loads read at base + c·l where they can, else its
// loops' variables from l. A thread that adds more than COMPENSATED_SUM_TERMS float terms
// (`each`, at most) carries what each addition lost into the next (Kahan's compensated sum),
// so that its sum's error does not grow with the length, as the CPU's lanes keep it: one
// block of 256 threads summing 10^7 terms would add 39,063 of them into one float each.
static void add_term(const SumSegment& seg, const Block& b, Stmt update, int l_id,
                     const std::string& loop, int64_t each, int& next_tmp, std::string& out,
                     int depth) {
    const std::string pad(size_t(depth) * 4, ' '), inner = pad + "    ";
    bool compensated = update.op == Op::REDUCE_SUM && update.dtype == DType::FLOAT32 &&
                       each > COMPENSATED_SUM_TERMS;
    if (compensated) out += pad + "{\n" + pad + "float tg_lost = 0.0f;\n";
    out += loop;
    update.val = term_by_iteration(seg, b, ex_var(l_id));
    if (!update.val) {
        out += segment_vars(seg, b, strf("i%d", l_id), inner);
        update.val = seg.term;
    }
    if (compensated) {
        CExprs cx{{}, next_tmp};
        out += cx.declare_shared({update.val}, inner);
        out += compensated_add(strf("acc%d", update.id), cx.str(update.val), inner);
    } else {
        c_stmts({update}, b.extents, {}, depth + 1, next_tmp, out);
    }
    out += pad + "}\n";
    if (compensated) out += pad + "}\n";
}

// Range `split` of a split sum's terms (plan.rows_each of them; numbered in the trees' order),
// added into the sum's accumulator, declared here: segment by segment, each as a loop over the
// number l of its iteration (the loads read at base + c·l where they can, else the segment's
// variables from l) that `group`'s threads split, or one thread runs (no group); a float of
// more than COMPENSATED_SUM_TERMS of them a thread (a block's) compensated.
static void add_range(const SumTree& tree, const Block& b, const KernelPlan& plan,
                      const CooperativeGroup* group, int& next_tmp, std::string& out) {
    long long each = (long long)plan.rows_each, terms = (long long)tree.terms;
    out += strf("    const int64_t first = split * %lldLL;\n"
                "    const int64_t last = first + %lldLL < %lldLL ? first + %lldLL : %lldLL;\n"
                "    float acc%d = 0.0f;\n",
                each, each, terms, each, terms, tree.sum);
    const int l_id = int(b.extents.size());   // a variable of no loop: l
    long long start = 0;
    for (const SumSegment& seg : tree.segments) {
        long long end = start + (long long)seg.terms;
        std::string lo = start ? strf("(first > %lldLL ? first : %lldLL) - %lldLL", start,
                                      start, start)
                               : "first";
        std::string hi = end < terms ? strf("(last < %lldLL ? last : %lldLL)", end, end) : "last";
        if (start) hi += strf(" - %lldLL", start);
        std::string from = group ? lo + " + " + group->thread : lo;
        std::string step = group ? strf(" += %d", group->size) : "++";
        // terms a thread adds, at most (0: one thread's column, not compensated)
        int64_t own = group ? terms_each(std::min(seg.terms, plan.rows_each), *group) : 0;
        add_term(seg, b, sum_update(tree.sum), l_id,
                 strf("    for (int64_t i%d = %s; i%d < %s; i%d%s) {\n", l_id, from.c_str(),
                      l_id, hi.c_str(), l_id, step.c_str()),
                 own, next_tmp, out, 1);
        start = end;
    }
}

// The body of a column sum's kernel (see plan_column_sum), after the column's variables and
// `item`, its number: it adds the rows of range `split` into tg_part; the column's last range
// to finish adds its ranges in order, then runs the epilogue.
static std::string render_column_sum(const Block& b, const KernelPlan& plan, int& next_tmp) {
    SumTree cs;
    if (!plan_column_sum(b, plan, cs)) fail("render: a nest planned as a column sum is not one");
    std::string acc = strf("acc%d", cs.sum), out;
    add_range(cs, b, plan, nullptr, next_tmp, out);
    out += strf("    tg_part[split * %lldLL + item] = %s;\n", (long long)plan.outputs,
                acc.c_str());
    out += last_range_goes_on(plan.splits, plan.outputs, "item", false);
    out += sum_of_ranges(acc, plan.splits, plan.outputs, "item", "    ", true);
    c_stmts(cs.epilogue, b.extents, {}, 1, next_tmp, out);
    return out;
}

// A cooperative item whose body is one sum tree and its epilogue (a sum whose axes are no
// powers of 16: the lowering's tree of loops and partial sums, each level a loop that every
// thread would run, with a reduction at each leaf) runs as a loop per segment of terms split
// over the group's threads, then one reduction: each term is added once, in a fixed order.
// Split (split_block_sums), a block adds range `split` of item `item`'s terms, and the item's
// last range to finish adds the ranges' totals in order (every thread, so that every thread
// holds the sum, as after a reduction) before the epilogue. False, with nothing written,
// where the body is not such a sum.
static bool cooperative_sum(const Program& p, size_t k, const Block& b, const KernelPlan& plan,
                            const CooperativeGroup& g, int& next_tmp, std::string& out) {
    SumTree tree;
    if (!match_sum(*plan.body, b, plan.splits == 1, tree)) return false;
    const int sum = tree.sum, l_id = int(b.extents.size());   // a variable of no loop: l
    if (plan.splits > 1) {
        add_range(tree, b, plan, &g, next_tmp, out);
    } else {
        out += strf("    float acc%d = 0.0f;\n", sum);
        for (const SumSegment& seg : tree.segments)
            add_term(seg, b, sum_update(sum), l_id, group_loop("    ", l_id, g, seg.terms),
                     terms_each(seg.terms, g), next_tmp, out, 1);
    }
    out += strf("    acc%d = %s<0>(acc%d);\n", sum, g.reduce, sum);
    if (plan.splits > 1) {
        out += strf("    if (%s == 0) tg_part[split * %lldLL + item] = acc%d;\n", g.thread,
                    (long long)plan.outputs, sum);
        out += last_range_goes_on(plan.splits, plan.outputs, "item", true);
        out += sum_of_ranges(strf("acc%d", sum), plan.splits, plan.outputs, "item", "    ", true);
    }
    std::unordered_map<int, Op> accs;
    cooperative_stmts(p, k, b, tree.epilogue, accs, g, 1, next_tmp, out);
    return true;
}

// Launches side by side: consecutive launches (threads, warps or blocks per item, tiles of a
// product; of a split's launches only the last, which adds the ranges, each with a scratch
// parameter of its own; no scan after them) that touch apart what the others write (no
// buffer, and no bytes of the temporaries' arena) run as one kernel, each on a range of its
// blocks: an optimizer's updates of every parameter, the sums of a layer norm's weight and
// bias gradients, the products of attention's gradients, a kernel where they were one each.
// Each block runs one launch's part, so the barriers of a block are reached by all its
// threads. Not with an in-place write beside a bounds check, which must stop it first.
// Products only while their blocks together are at most a wave (8 a multiprocessor: more gain
// nothing from company); their staged terms share the kernel's one array (tg_tiles), as large
// as the largest's, since a block runs one of them.
static const size_t SIDE_BY_SIDE_MAX = 64;   // launches in one kernel (its parameters grow)
static bool runs_beside(const Program& p, const Launch& l, const KernelPlan& plan) {
    NestBuffers buffers = nest_buffers(p, l.block, l.part);
    bool whole = l.stage == 0 && !plan.serial && plan.splits == 1;
    bool totals = l.stage == 2 || (l.stage == 1 && !plan.serial);   // a split's last launch
    return (whole || totals) && l.part.finite_site < 0 && buffers.arrays.empty();
}
// A launch of one thread (a nest of scalars: an optimizer's step count, its bias corrections).
// Such launches in a row run one after the other in the one thread of a kernel (in_sequence),
// whatever they touch: their order is kept.
static bool one_thread(const Launch& l, const KernelPlan& plan) {
    return l.stage == 0 && plan.items == 1 && plan.grid.empty() && !plan.cooperative &&
           !plan.product && !plan.serial && l.part.finite_site < 0;
}
bool in_sequence(const Program& p, const std::vector<Launch>& ls,
                 const std::vector<size_t>& kernel) {
    for (size_t i : kernel)
        if (!one_thread(ls[i], plan_kernel(p, ls[i].block, ls[i].part))) return false;
    return kernel.size() > 1;
}
// Its blocks: a split scatter's second kernel has a thread per output.
static int64_t launch_blocks(const Program& p, const Launch& l) {
    KernelPlan plan = plan_kernel(p, l.block, l.part);
    if (l.stage == 2) return (plan.outputs + CUDA_BLOCK_THREADS - 1) / CUDA_BLOCK_THREADS;
    return plan.blocks();
}
// A kernel's blocks: its launches' side by side, or one where they run in sequence.
static int64_t kernel_blocks(const Program& p, const std::vector<Launch>& ls,
                             const std::vector<size_t>& kernel) {
    if (in_sequence(p, ls, kernel)) return 1;
    int64_t blocks = 0;
    for (size_t i : kernel) blocks += launch_blocks(p, ls[i]);
    return blocks;
}
// The floats of tg_tiles that a kernel's products stage their terms in (0: no product)
static int64_t tiles_shared(const Program& p, const std::vector<Launch>& ls,
                            const std::vector<size_t>& kernel) {
    int64_t floats = 0;
    for (size_t i : kernel) {
        ProductPlan plan;
        if (plan_kernel(p, ls[i].block, ls[i].part).product && plan_product(ls[i].part, plan))
            floats = std::max(floats, staged_floats(plan));
    }
    return floats;
}
std::vector<std::vector<size_t>> kernels_of(const Program& p, const std::vector<Launch>& ls) {
    auto bytes = [&](int buffer) {   // its range in the arena, or none (-1, -1)
        const ProgramBuffer& pb = p.buffers[size_t(buffer)];
        if (pb.role != ProgramBuffer::TEMP || pb.offset < 0) return std::make_pair(-1LL, -1LL);
        long long at = (long long)pb.offset;
        return std::make_pair(at, at + (long long)temp_bytes(pb));
    };
    auto touch = [&](const BlockAccesses& writer, const BlockAccesses& other) {
        for (const Access& w : writer.accesses) {
            if (!w.write) continue;
            auto wb = bytes(w.buffer);
            for (const Access& a : other.accesses) {
                auto ab = bytes(a.buffer);
                if (a.buffer == w.buffer || (wb.first >= 0 && ab.first >= 0 &&
                                             wb.first < ab.second && ab.first < wb.second))
                    return true;
            }
        }
        return false;
    };
    std::vector<std::vector<size_t>> kernels;
    std::vector<BlockAccesses> uses;   // of the last kernel's launches, where they run beside
    bool checks = false, in_place = false;   // of the last kernel's launches
    bool one_threads = false;                 // its launches, all of one thread
    int64_t product_blocks = 0;               // of its products
    for (size_t i = 0; i < ls.size(); i++) {
        BlockAccesses u = block_accesses(ls[i].part);
        KernelPlan plan = plan_kernel(p, ls[i].block, ls[i].part);
        bool beside = runs_beside(p, ls[i], plan), writes_in_place = ls[i].part.writes_in_place;
        int64_t own_blocks = plan.product ? plan.blocks() : 0;
        // a bounds check and an in-place write apart: the check must stop the write first
        bool kept_apart = (checks || u.checks) && (in_place || writes_in_place);
        bool joins = beside && !uses.empty() && uses.size() < SIDE_BY_SIDE_MAX && !kept_apart;
        if (own_blocks)
            joins = joins && product_blocks + own_blocks <= 8 * GPU_MULTIPROCESSORS;
        for (size_t j = 0; joins && j < uses.size(); j++)
            joins = !touch(uses[j], u) && !touch(u, uses[j]);
        bool single = one_thread(ls[i], plan);
        if (one_threads && kernels.back().size() > 1) joins = false;   // in sequence: apart no more
        if (one_threads && single && kernels.back().size() < SIDE_BY_SIDE_MAX && !kept_apart)
            joins = true;   // after them, in their thread
        if (!joins) {
            kernels.push_back({});
            uses.clear();
            checks = in_place = false;
            one_threads = true;
            product_blocks = 0;
        }
        one_threads = one_threads && single;
        kernels.back().push_back(i);
        if (beside) uses.push_back(u);
        checks = checks || u.checks;
        in_place = in_place || writes_in_place;
        product_blocks += own_blocks;
    }
    return kernels;
}
// A kernel's parameters: the buffers its launches read or write (written by any: not const).
static std::map<int, bool> kernel_buffers(const Program& p, const std::vector<Launch>& ls,
                                          const std::vector<size_t>& kernel) {
    std::map<int, bool> writes;
    for (size_t i : kernel)
        for (auto [buffer, w] : nest_buffers(p, ls[i].block, ls[i].part).params)
            writes[buffer] = writes[buffer] || w;
    return writes;
}

// The body of one launch's kernel, its blocks numbered by `block` (blockIdx.x, or less the
// blocks of the launches before it in a kernel of several).
static std::string render_launch(const Program& p, const Launch& launch, const char* block) {
    std::string out;
    size_t k = launch.block;
    const Block& b = launch.part;
    NestBuffers buffers = nest_buffers(p, k, b);
    std::map<int, std::string>& arrays = buffers.arrays;
    KernelPlan plan = plan_kernel(p, k, b);
    // one decision for the whole block; a launch of one thread decides alone (in sequence
    // after others, the rest of its block has returned: no barrier)
    if (b.writes_in_place && !p.checks.empty())
        out += one_thread(launch, plan)
                   ? "    if (err[0] != 0) return;\n"
                   : "    __shared__ int failed;\n    if (threadIdx.x == 0) failed = err[0] != 0;\n"
                     "    __syncthreads();\n    if (failed) return;\n";
    int next_tmp = 0;
    if (plan.product) return out + render_product(b, launch.stage, block, next_tmp);
    if (launch.stage == 2) {   // a split scatter's totals, by element
        out += strf("    const int64_t e = (int64_t)%s * %d + threadIdx.x;\n"
                    "    if (e >= %lldLL) return;\n",
                    block, CUDA_BLOCK_THREADS, (long long)plan.outputs);
        out += sum_of_ranges("sum", plan.splits, plan.outputs, "e");
        return out + strf("    buf%d[e] += sum;\n", plan.scatter_buffer);
    }
    if (plan.warp)
        out += strf("    int64_t t = (int64_t)%s * %d + threadIdx.x / 32;\n"
                    "    if (t >= %lldLL) return;   // the warp's item\n"
                    "    const int lane = threadIdx.x %% 32;\n",
                    block, CUDA_BLOCK_THREADS / 32, (long long)plan.items);
    else if (plan.cooperative)
        out += strf("    int64_t t = %s;\n", block);
    else
        out += strf("    int64_t t = (int64_t)%s * %d + threadIdx.x;\n"
                    "    if (t >= %lldLL) return;\n",
                    block, CUDA_BLOCK_THREADS, (long long)plan.items);
    if (launch.stage == 1) {   // a split scatter's, column sum's or block sum's range
        long long columns = (long long)(plan.items / plan.splits);
        out += strf("    const int64_t split = t / %lldLL;\n    t %%= %lldLL;\n", columns,
                    columns);
    }
    if (plan.column_sum || (plan.cooperative && plan.splits > 1))
        out += "    const int64_t item = t;\n";
    if (plan.grid.empty()) out += "    (void)t;\n";
    for (size_t l = plan.grid.size(); l-- > 0;) {
        int id = plan.grid[l]->id;
        if (l == 0) out += strf("    int64_t i%d = t;\n", id);
        else {
            long long n = (long long)b.extents[size_t(id)];
            out += strf("    int64_t i%d = t %% %lldLL;\n    t /= %lldLL;\n", id, n, n);
        }
    }
    if (arrays.count(-1)) out += "    " + arrays[-1];
    for (const Stmt* v : plan.values) c_stmts({*v}, b.extents, arrays, 1, next_tmp, out);
    int around = plan.grid.empty() ? -1 : plan.grid.back()->id;
    if (around >= 0 && arrays.count(around)) out += "    " + arrays[around];
    std::unordered_map<int, Op> accs;
    if (plan.column_sum) {
        out += render_column_sum(b, plan, next_tmp);
    } else if (plan.cooperative) {
        const CooperativeGroup& group = plan.warp ? WARP_GROUP : BLOCK_GROUP;
        if (!cooperative_sum(p, k, b, plan, group, next_tmp, out))
            cooperative_stmts(p, k, b, *plan.body, accs, group, 1, next_tmp, out);
    } else if (plan.serial) {
        int id = plan.serial->id;
        long long rows = (long long)b.extents[size_t(id)], each = plan.rows_each;
        std::string body;
        c_stmts(*plan.body, b.extents, arrays, 2, next_tmp, body);
        if (launch.stage == 1) {   // its rows of the range, into the range's copy
            out += strf("    float *tg_range = tg_part + split * %lldLL;\n"
                        "    const int64_t first = split * %lldLL;\n"
                        "    const int64_t last = first + %lldLL < %lldLL ? first + %lldLL : "
                        "%lldLL;\n",
                        (long long)plan.outputs, each, each, rows, each, rows);
            out += strf("    for (int64_t i%d = first; i%d < last; i%d++) {\n", id, id, id);
            std::string from = strf("buf%d[", plan.scatter_buffer);
            for (size_t at; (at = body.find(from)) != std::string::npos;)
                body.replace(at, from.size(), "tg_range[");
        } else {
            out += strf("    for (int64_t i%d = 0; i%d < %lldLL; i%d++) {\n", id, id, rows, id);
        }
        out += body + "    }\n";
    } else {
        c_stmts(*plan.body, b.extents, arrays, 1, next_tmp, out);
    }
    return out;
}

// A kernel whose code (its buffers renumbered, as the C emitter's) an earlier one has launches
// that one's function with its own buffers: NVRTC reads each code once (a model's layers). As
// in C, a kernel is passed a buffer from the least constant its indices add (index_offsets), so
// that kernels at other offsets of one (a recurrent layer's steps) share the code too: a
// multiple of 16 bytes, so that an index's alignment for a vector store stays what it was; not
// in a kernel of split sums, whose scratch and scatter index buffers by their elements.
CudaSource render_cuda_kernels(const Program& p) {
    const char NAME = '\x02';   // the function's name, until its code is compared
    const char LAUNCH = '\x03';   // around a launch's name in a comment, which compares equal
    CudaSource source;
    std::string& out = source.text;
    std::map<std::string, std::string> function_with_code;
    std::vector<Launch> launches = launches_of(p);
    for (const std::vector<size_t>& kernel : kernels_of(p, launches)) {
        std::map<int, bool> used = kernel_buffers(p, launches, kernel);
        std::map<int, int64_t> offsets;
        std::vector<const Block*> parts;
        bool split = false;
        for (size_t i : kernel) {
            parts.push_back(&launches[i].part);
            split = split || launches[i].stage != 0;
        }
        for (auto [buffer, writes] : used) {
            int64_t size = int64_t(dtype_size(p.buffers[size_t(buffer)].dtype));
            if (split || 16 % size) continue;
            std::map<int, int64_t> own = index_offsets(parts, {buffer}, 16 / size);
            offsets.insert(own.begin(), own.end());
        }
        if (!offsets.empty())
            for (size_t i : kernel) shift_indices(launches[i].part, offsets);
        const Launch& first = launches[kernel[0]];
        std::string comment, body;
        bool large_tiles = false;   // a product's of 128 x 128
        for (size_t n = 0; n < kernel.size(); n++) {   // the last comment left open
            const Launch& l = launches[kernel[n]];
            ProductPlan product;
            large_tiles = large_tiles || (plan_kernel(p, l.block, l.part).product &&
                                          plan_product(l.part, product) && product.tile == 128);
            const std::string& origin = l.part.origin;
            if (n) comment += " */";
            comment += "\n/* " + l.part.title + (origin.empty() ? "" : "\n   from " + origin);
        }
        // TG_CUDA_PRODUCT_BLOCKS=2: a kernel of 128 x 128 tiles compiled for two blocks per
        // multiprocessor, at most 128 registers a thread. A variant to time: ptxas 13.0 fits
        // most in 127 registers unasked, but takes 145 for attention's scores, whose operands
        // add a bias (one block a multiprocessor), and 128 with no spills asked. (Smaller tiles
        // fit three or four blocks unasked, and asked for two would take more registers.)
        std::string bounds = strf("%d", CUDA_BLOCK_THREADS);
        int product_blocks = env_int("TG_CUDA_PRODUCT_BLOCKS", 1, 1, 8);
        if (large_tiles && product_blocks > 1) bounds += strf(", %d", product_blocks);
        if (int64_t floats = tiles_shared(p, launches, kernel))
            body += strf("    __shared__ __align__(16) float tg_tiles[%lld];\n", (long long)floats);
        auto indented = [&](const std::string& lines) {   // by one more level
            for (size_t at = 0; at < lines.size();) {
                size_t eol = std::min(lines.find('\n', at), lines.size() - 1);
                body += "    " + lines.substr(at, eol - at + 1);
                at = eol + 1;
            }
        };
        if (kernel.size() == 1) {
            body += render_launch(p, first, "blockIdx.x");
        } else if (in_sequence(p, launches, kernel)) {   // one block: thread 0 runs them in order
            for (size_t i : kernel) {
                body += strf("    {   // %c%s%c\n", LAUNCH, launches[i].name.c_str(), LAUNCH);
                indented(render_launch(p, launches[i], "0"));
                body += "    }\n";
            }
        } else {
            int64_t blocks = 0;   // those of the launches before
            for (size_t n = 0; n < kernel.size(); n++) {
                const Launch& l = launches[kernel[n]];
                int64_t own = launch_blocks(p, l);
                std::string block = blocks ? strf("(blockIdx.x - %lldu)", (long long)blocks)
                                           : std::string("blockIdx.x");
                body += strf("%sif (blockIdx.x < %lldu) {   // %c%s%c\n", n ? " else " : "    ",
                             (long long)(blocks + own), LAUNCH, l.name.c_str(), LAUNCH);
                if (l.stage)   // its scratch, by the name its body uses
                    body += strf("        float *__restrict__ const tg_part = tg_part%zu;\n", n);
                indented(render_launch(p, l, block.c_str()));
                body += "    }";
                blocks += own;
            }
            body += "\n";
        }
        std::vector<std::pair<int, bool>> buffers(used.begin(), used.end());
        order_by_first_use(buffers, body);
        std::string params;
        source.buffers.emplace_back();
        source.offsets.emplace_back();
        for (auto [i, writes] : buffers) {
            const DType dt = p.buffers[size_t(i)].dtype;
            params += strf("%s%s *__restrict__ buf%d, ", writes ? "" : "const ", c_type(dt), i);
            source.buffers.back().push_back(i);
            source.offsets.back().push_back(offsets.count(i) ? size_t(offsets[i]) * dtype_size(dt)
                                                             : 0);
        }
        for (size_t n = 0; n < kernel.size(); n++)   // each split launch's scratch
            if (launches[kernel[n]].stage)
                params += kernel.size() == 1 ? std::string("float *__restrict__ tg_part, ")
                                             : strf("float *__restrict__ tg_part%zu, ", n);
        std::string code =
            strf("\nextern \"C\" __global__ void __launch_bounds__(%s) %c(%sint64_t *err) {\n",
                 bounds.c_str(), NAME, params.c_str()) + body + "}\n";
        std::string same;   // the code as compared: without the launches' names
        bool in_name = false;
        for (char c : code)
            if (c == LAUNCH) in_name = !in_name;
            else if (!in_name) same += c;
        const std::string& fn =
            function_with_code.emplace(renumber_buffers(same).c, first.name).first->second;
        source.function.push_back(fn);
        if (fn != first.name) {
            out += comment + "\n   runs " + fn + "'s code */\n";
            continue;
        }
        code.erase(std::remove(code.begin(), code.end(), LAUNCH), code.end());
        out += comment + " */" + code.replace(code.find(NAME), 1, fn);
    }
    // TG_CHECK's scan: the element reported is one that is not finite (not always the first)
    bool scans = false;
    for (const Block& b : p.blocks) scans = scans || b.finite_site >= 0;
    if (scans)
        for (const char* t : {"float", "double"})
            out += strf("\nextern \"C\" __global__ void tg_finite_%s(const %s *x, int64_t n, "
                        "int site, int64_t *err) {\n"
                        "    int64_t i = (int64_t)blockIdx.x * %d + threadIdx.x;\n"
                        "    if (i >= n || x[i] - x[i] == 0) return;\n"
                        "    if (atomicCAS((unsigned long long *)err, 0ull, "
                        "(unsigned long long)(site + 1)) == 0ull)\n"
                        "        err[1] = 2 * i + (x[i] == x[i]);\n"
                        "}\n",
                        t, t, CUDA_BLOCK_THREADS);
    out = cuda_prelude(out) + out;
    return source;
}
std::string render_cuda(const Program& p) { return render_cuda_kernels(p).text; }

// ---- [CUDA COMPILE] NVRTC, with the disk cache ---------------------------------------------
// The options for NVRTC to compile for target (sm_90: a CUBIN; compute_90: PTX), then flags
// (TG_NVRTC_FLAGS's: more options, space-separated)
static std::vector<std::string> nvrtc_options(const std::string& target, bool debug_info,
                                              const std::string& flags) {
    std::vector<std::string> options = {"--gpu-architecture=" + target, "--fmad=false",
                                        "-std=c++17"};
    if (debug_info) { options.push_back("-G"); options.push_back("-lineinfo"); }
    std::istringstream extra(flags);
    for (std::string o; extra >> o;) options.push_back(o);
    return options;
}

// NVRTC's program of source compiled for target with options, or a tg::Error with NVRTC's log
// that keeps the source in the cache dir as KEY.cu.
static void* nvrtc_program(const Nvrtc* nv, const std::string& source, const std::string& name,
                           const std::string& target, const std::vector<std::string>& options,
                           const std::string& key) {
    void* prog = nullptr;
    nvrtcResult r =
        nv->nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
    if (r) fail(strf("CUDA: nvrtcCreateProgram failed: %s", nv->nvrtcGetErrorString(r)));
    std::vector<const char*> opts;
    for (auto& o : options) opts.push_back(o.c_str());
    r = nv->nvrtcCompileProgram(prog, int(opts.size()), opts.data());
    if (!r) return prog;
    size_t log_size = 0;
    nv->nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nv->nvrtcGetProgramLog(prog, &log[0]);
    nv->nvrtcDestroyProgram(&prog);
    std::string kept = cache_dir() + "/" + key + ".cu";
    write_file_atomic(kept, source);
    fail(strf("CUDA: NVRTC %d.%d could not compile %s for %s: %s\n%s\nsource kept at %s",
              nv->major, nv->minor, name.c_str(), target.c_str(), nv->nvrtcGetErrorString(r),
              log.c_str(), kept.c_str()));
}

std::string nvrtc_compile(const std::string& source, int arch, const std::string& name,
                          bool debug_info) {
    std::string why;
    const Nvrtc* nv = nvrtc(&why);
    if (!nv) fail(why);
    std::string target = strf("sm_%d", arch);
    std::vector<std::string> options =
        nvrtc_options(target, debug_info, env_str("TG_NVRTC_FLAGS", ""));
    std::string key_text = source + '\0' + strf("nvrtc %d.%d", nv->major, nv->minor);
    for (const std::string& o : options) key_text += '\0' + o;
    std::string key = hex16(fnv1a64(key_text));
    static std::unordered_map<std::string, std::string> compiled;   // guarded by runtime_mutex
    std::string path = cache_dir() + "/" + key + ".cubin", sum = path + ".sum", cubin, recorded;
    {
        std::lock_guard<std::mutex> lock(runtime_mutex);
        auto hit = compiled.find(key);
        if (hit != compiled.end()) { global_stats.memory_cache_hits++; return hit->second; }
        if (read_file(path, cubin) && read_file(sum, recorded) && recorded == so_checksum(cubin) &&
            private_file(path)) {
            global_stats.disk_cache_hits++;
            return compiled[key] = cubin;
        }
    }
    // compiled without the lock: NVRTC compiles programs on several threads at once
    auto t0 = std::chrono::steady_clock::now();
    void* prog = nvrtc_program(nv, source, name, target, options, key);
    size_t size = 0;
    nv->nvrtcGetCUBINSize(prog, &size);
    cubin.assign(size, '\0');
    if (size) nv->nvrtcGetCUBIN(prog, &cubin[0]);
    nv->nvrtcDestroyProgram(&prog);
    write_file_atomic(path, cubin);
    write_file_atomic(sum, so_checksum(cubin));
    std::lock_guard<std::mutex> lock(runtime_mutex);
    global_stats.compiles++;
    global_stats.compile_seconds += seconds_since(t0);
    return compiled[key] = cubin;
}

void nvrtc_check(const std::string& source, int arch, const std::string& name,
                 const std::string& flags) {
    std::string why;
    const Nvrtc* nv = nvrtc(&why);
    if (!nv) fail(why);
    std::string target = strf("compute_%d", arch);
    void* prog = nvrtc_program(nv, source, name, target, nvrtc_options(target, false, flags),
                               hex16(fnv1a64(source)));
    nv->nvrtcDestroyProgram(&prog);
}

// ---- [CUDA DEVICE] context, stream, memory, programs ---------------------------------------
struct CudaKernel {
    CUhandle fn = nullptr;
    std::vector<int> buffers;   // its arguments before the scratch and err
    std::vector<size_t> offsets;   // bytes into each of them
    // each split launch's partial sums, in the order of its launches (a split scatter's
    // second kernel reads its first's), and those this kernel allocated
    std::vector<void*> scratch, owned;
    size_t zero_bytes = 0;   // a split scatter's (alone in its kernel): zeroed before each run
    std::string name;           // TG_CUDA_PROFILE's: program-hash/kernel: the nest's title
    int64_t blocks = 1;
    int finite_site = -1, finite_buffer = -1;
    int64_t finite_count = 0;
    CUhandle finite_scan = nullptr;   // TG_CHECK's scan of its output, if any
};

class CudaDevice : public Device {
public:
    explicit CudaDevice(int ordinal = 0)
        : ordinal_(ordinal), name_(ordinal ? strf("CUDA:%d", ordinal) : "CUDA") {}
    const char* name() const override { return name_.c_str(); }

    // The driver, a context on the GPU current on this thread, and the stream: at first use.
    const CudaDriver& driver() {
        std::lock_guard<std::mutex> lock(m_);
        if (!ready_) start();
        d_->cuCtxSetCurrent(context_);
        return *d_;
    }
    void check(CUresult r, const char* call) {
        if (r) fail(strf("CUDA: %s failed: %s", call, cu_error(*d_, r).c_str()));
    }
    CUhandle stream() { driver(); return stream_; }
    int arch() { driver(); return arch_; }
    std::string gpu_name() { driver(); return gpu_name_; }

    void* alloc(size_t bytes) override {
        const CudaDriver& d = driver();
        size_t size = EXACT_BUFFERS ? std::max<size_t>(bytes, 1) : size_class(bytes);
        std::lock_guard<std::mutex> lock(m_);
        auto cached = EXACT_BUFFERS ? free_.end() : free_.find(size);
        if (cached != free_.end()) {
            CUdeviceptr p = cached->second;
            free_.erase(cached);
            sizes_[p] = size;
            return reinterpret_cast<void*>(p);
        }
        CUdeviceptr p = 0;
        CUresult r = d.cuMemAlloc(&p, size);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {   // give the cached blocks back and try again
            d.cuStreamSynchronize(stream_);
            for (auto& [s, block] : free_) d.cuMemFree(block);
            free_.clear();
            r = d.cuMemAlloc(&p, size);
        }
        if (r)
            fail(strf("CUDA: cuMemAlloc of %zu bytes failed: %s", size, cu_error(d, r).c_str()));
        sizes_[p] = size;
        return reinterpret_cast<void*>(p);
    }
    void free(void* ptr) override {
        std::lock_guard<std::mutex> lock(m_);
        auto p = CUdeviceptr(ptr);
        auto it = sizes_.find(p);
        if (it == sizes_.end()) return;
        if (EXACT_BUFFERS) {
            d_->cuStreamSynchronize(stream_);   // the kernels queued may still read it
            d_->cuMemFree(p);
            sizes_.erase(it);
            return;
        }
        // first among its size's: the block freed last is used first (what it held may
        // still be in the GPU's L2)
        free_.insert(free_.lower_bound(it->second), {it->second, p});
        sizes_.erase(it);
    }
    // Returns while the GPU copies: src is copied into pinned host memory (a staging block),
    // which the GPU reads from after the work queued before; the block is used again once the
    // event recorded after its copy has happened. A copy of more than STAGING_MAX bytes waits
    // (pinning that much costs more than the wait saves).
    static const size_t STAGING_MAX = size_t(16) << 20, STAGING_TOTAL = size_t(64) << 20;
    void copy_in(void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        const CudaDriver& d = driver();
        if (bytes > STAGING_MAX) {
            check(d.cuMemcpyHtoDAsync(CUdeviceptr(dst), src, bytes, stream_),
                  "cuMemcpyHtoDAsync");
            check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");   // src may go away
            return;
        }
        std::lock_guard<std::mutex> lock(staging_mutex_);
        Staging* block = free_staging(bytes);
        if (!block && staged_bytes_ + size_class(bytes) > STAGING_TOTAL) {
            check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");   // every block free
            block = free_staging(bytes);
        }
        if (!block) {
            Staging fresh{nullptr, size_class(bytes), nullptr};
            check(d.cuMemAllocHost(&fresh.host, fresh.size), "cuMemAllocHost");
            check(d.cuEventCreate(&fresh.copied, 2 /* CU_EVENT_DISABLE_TIMING */),
                  "cuEventCreate");
            staged_bytes_ += fresh.size;
            staging_.push_back(fresh);
            block = &staging_.back();
        }
        std::memcpy(block->host, src, bytes);
        check(d.cuMemcpyHtoDAsync(CUdeviceptr(dst), block->host, bytes, stream_),
              "cuMemcpyHtoDAsync");
        check(d.cuEventRecord(block->copied, stream_), "cuEventRecord");
    }
    void copy_out(void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        const CudaDriver& d = driver();
        check(d.cuMemcpyDtoHAsync(dst, CUdeviceptr(src), bytes, stream_), "cuMemcpyDtoHAsync");
        check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    }
    // To another GPU: a peer copy (through the host only where the two cannot reach each
    // other, which the driver handles) on this device's stream, after the work queued on the
    // other (which may still read dst) and before the work queued there next; the host goes
    // on. To host memory: straight into it.
    void copy_to(Device& to, void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        if (to.host_memory()) return copy_out(dst, src, bytes);
        auto* gpu = dynamic_cast<CudaDevice*>(&to);
        if (!gpu) return Device::copy_to(to, dst, src, bytes);
        gpu->happens_before(*this);
        const CudaDriver& d = driver();
        check(d.cuMemcpyPeerAsync(CUdeviceptr(dst), gpu->context(), CUdeviceptr(src), context_,
                                  bytes, stream_), "cuMemcpyPeerAsync");
        happens_before(*gpu);
    }
    // An event at the end of the work queued so far (timing: for Event's milliseconds_since).
    CUhandle record(bool timing = false) {
        const CudaDriver& d = driver();
        CUhandle event = nullptr;
        check(d.cuEventCreate(&event, timing ? 0 : 2 /* CU_EVENT_DISABLE_TIMING */),
              "cuEventCreate");
        check(d.cuEventRecord(event, stream_), "cuEventRecord");
        return event;
    }
    // this device's work queued from now on waits for the event
    void wait(CUhandle event) {
        check(driver().cuStreamWaitEvent(stream_, event, 0), "cuStreamWaitEvent");
    }
    // other's work queued from now on waits for this device's work queued so far
    void happens_before(CudaDevice& other) {
        CUhandle event = record();
        other.wait(event);
        check(driver().cuEventDestroy(event), "cuEventDestroy");   // freed once it has happened
    }
    void synchronize() { check(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }
    CUhandle context() { driver(); return context_; }
    void queue_thread_start() override { driver(); }   // its context, current there

    std::shared_ptr<Executable> prepare(const Program& p) override;
    std::string source(const Program& p) override { return render_cuda(p); }
    std::string settings() const override {
        return env_str("TG_NVRTC_FLAGS", "") + '|' + env_str("TG_CUDA_TILE", "") + '|' +
               env_str("TG_CUDA_PRODUCT_BLOCKS", "") + '|' + env_str("TG_CUDA_TF32", "") + '|' +
               env_str("TG_CUDA_SMALL_PLANS", "");
    }
    const char* source_suffix() const override { return ".cu"; }
    // Fusing nests into one loop over rows (fuse_loops) and arrays local to a loop
    // (local_temps) suit a CPU core's cache; on the GPU they leave a few threads with long
    // serial loops (W3's step: 256 threads where unfused nests give 262,144). fuse_maps joins
    // elementwise nests whose every loop fuses, so the grid stays whole, and nests over the
    // same rows only where many rows each run on a warp or a block. The CPU's
    // tiles of vector sums (tile_products) are plan_kernel's business here, and a select or a
    // division by a constant costs a GPU thread less than the loops that split_at_edges and
    // split_divided make.
    bool runs_pass(const std::string& pass) const override {
        return pass != "fuse_loops" && pass != "local_temps" && pass != "tile_products" &&
               pass != "sum_lanes" && pass != "split_divided" && pass != "split_at_edges";
    }
    // A GPU thread computes a GELU's tanh for less than it costs to store it and load it
    // again: W7's MLP stored the tanh, its sign and e^-2|z| (three tensors of 8192 x 2048 a
    // layer) in the forward product's epilogue, and loaded them in the backward one.
    bool recomputes_calls() const override { return true; }

private:
    struct Staging {
        void* host;
        size_t size;
        CUhandle copied;   // recorded after its last copy (never recorded: done)
    };
    // a staging block of at least `bytes` whose copy has happened (staging_mutex_ held)
    Staging* free_staging(size_t bytes) {
        for (Staging& block : staging_) {
            if (block.size < bytes) continue;
            CUresult r = d_->cuEventQuery(block.copied);
            if (r == CUDA_ERROR_NOT_READY) continue;
            check(r, "cuEventQuery");
            return &block;
        }
        return nullptr;
    }
    // sizes up to 4 KiB in steps of 256 bytes, then four classes per power of two (a block
    // wastes less than a fifth). Under AddressSanitizer (TG_EXACT_HEAP_BUFFERS: the CPU
    // stand-in's device memory is host memory) a buffer is an allocation of exactly its bytes,
    // freed at once, so that a kernel reading past it is reported there, as compute-sanitizer
    // would report it on a GPU, where a size class's slack or a kept block would hide it.
#ifdef TG_EXACT_HEAP_BUFFERS
    static constexpr bool EXACT_BUFFERS = true;
#else
    static constexpr bool EXACT_BUFFERS = false;
#endif
    static size_t size_class(size_t bytes) {
        if (bytes <= 4096) return std::max<size_t>(256, (bytes + 255) / 256 * 256);
        size_t top = 4096;
        while (top * 2 < bytes) top *= 2;
        size_t step = top / 4;
        return (bytes + step - 1) / step * step;
    }
    void start() {
        std::string why;
        d_ = cuda_driver(&why);
        if (!d_) fail(why);
        CUresult r = d_->cuInit(0);
        if (r) fail("CUDA: cuInit failed: " + cu_error(*d_, r));
        int count = 0;
        check(d_->cuDeviceGetCount(&count), "cuDeviceGetCount");
        if (count == 0) fail("CUDA: cuDeviceGetCount found no GPU");
        if (ordinal_ >= count)
            fail(strf("CUDA: there is no %s: this machine has %d GPU%s (CUDA:0 to CUDA:%d)",
                      name_.c_str(), count, count == 1 ? "" : "s", count - 1));
        CUdevice dev = 0;
        check(d_->cuDeviceGet(&dev, ordinal_), "cuDeviceGet");
        int major = 0, minor = 0;
        check(d_->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
              "cuDeviceGetAttribute");
        check(d_->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
              "cuDeviceGetAttribute");
        arch_ = major * 10 + minor;
        char gpu[256] = {};
        check(d_->cuDeviceGetName(gpu, sizeof gpu - 1, dev), "cuDeviceGetName");
        gpu_name_ = gpu;
        check(d_->cuDevicePrimaryCtxRetain(&context_, dev), "cuDevicePrimaryCtxRetain");
        check(d_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
        check(d_->cuStreamCreate(&stream_, 0), "cuStreamCreate");
        ready_ = true;
    }

    int ordinal_;
    std::string name_;
    std::mutex m_;
    bool ready_ = false;
    const CudaDriver* d_ = nullptr;
    CUhandle context_ = nullptr, stream_ = nullptr;
    int arch_ = 0;
    std::string gpu_name_;
    std::multimap<size_t, CUdeviceptr> free_;          // cached blocks by size class
    std::unordered_map<CUdeviceptr, size_t> sizes_;    // blocks in use
    std::mutex staging_mutex_;
    std::deque<Staging> staging_;                      // pinned blocks copy_in copies from
    size_t staged_bytes_ = 0;
};

static CudaDevice& cuda_device() {
    static CudaDevice* device = new CudaDevice;   // never destroyed: buffers outlive main()
    return *device;
}

// A program's kernels. From its second run on, a program without TG_CHECK's scans (which stop
// it part-way) runs as one CUDA graph of its launches: one call from the host for the whole
// program (a jitted training step), where the first run's launches cost a call each. Where a
// run's buffers differ from the graph's (a jitted step's new inputs), the kernels that take
// them have their arguments set again; nothing is recorded twice. TG_CUDA_GRAPHS=0: never.
// TG_CUDA_PROFILE's sums, by program/kernel (guarded by runtime_mutex)
struct KernelTime {
    int64_t calls = 0;
    double ms = 0;
};
static std::map<std::string, KernelTime>& kernel_times() {
    static std::map<std::string, KernelTime> times;
    return times;
}

struct CudaProgram : Executable {
    CudaDevice& dev;
    CUhandle module = nullptr;
    std::vector<CudaKernel> kernels;
    void* err_buffer;   // int64_t[2] on the device
    bool scans = false;
    std::atomic<int64_t> runs{0};
    CUhandle graph = nullptr, graph_exec = nullptr;
    std::vector<CUhandle> nodes;                // per kernel (null: none, its grid is empty)
    std::vector<std::vector<void*>> graph_args;  // per kernel, the arguments in its node
    std::mutex graph_mutex;
    explicit CudaProgram(CudaDevice& d) : dev(d), err_buffer(d.alloc(16)) {}
    ~CudaProgram() override {
        if (graph_exec) dev.driver().cuGraphExecDestroy(graph_exec);
        if (graph) dev.driver().cuGraphDestroy(graph);
        if (module) {   // after the launches queued from it
            dev.driver().cuStreamSynchronize(dev.stream());
            dev.driver().cuModuleUnload(module);
        }
        for (const CudaKernel& k : kernels)
            for (void* s : k.owned) dev.free(s);
        dev.free(err_buffer);
    }

    std::vector<void*> args_of(const CudaKernel& k, void* const* buffers) {
        std::vector<void*> args;
        for (size_t i = 0; i < k.buffers.size(); i++)
            args.push_back(static_cast<char*>(buffers[k.buffers[i]]) + k.offsets[i]);
        for (void* s : k.scratch) args.push_back(s);
        args.push_back(err_buffer);
        return args;
    }
    static std::vector<void*> params_of(std::vector<void*>& args) {
        std::vector<void*> params;   // a pointer to each argument's value, as CUDA takes them
        for (void*& a : args) params.push_back(&a);
        return params;
    }
    void launch(CUhandle fn, int64_t blocks, std::vector<void*> params) {
        if (blocks == 0) return;   // a nest over an empty tensor
        dev.check(dev.driver().cuLaunchKernel(fn, unsigned(blocks), 1, 1, CUDA_BLOCK_THREADS, 1,
                                              1, 0, dev.stream(), params.data(), nullptr),
                  "cuLaunchKernel");
    }
    bool read_err(int64_t* err) {
        const CudaDriver& d = dev.driver();
        dev.check(d.cuMemcpyDtoHAsync(err, CUdeviceptr(err_buffer), 16, dev.stream()),
                  "cuMemcpyDtoHAsync");
        dev.check(d.cuStreamSynchronize(dev.stream()), "cuStreamSynchronize (a kernel failed)");
        return err[0] != 0;
    }
    CudaKernelNodeParams node_params(const CudaKernel& k, std::vector<void*>& params) {
        CudaKernelNodeParams n{};
        n.func = k.fn;
        n.grid_x = unsigned(k.blocks);
        n.grid_y = n.grid_z = n.block_y = n.block_z = 1;
        n.block_x = CUDA_BLOCK_THREADS;
        n.params = params.data();
        return n;
    }
    // the graph of the kernels, made at the first call, its arguments set to these buffers
    void launch_graph(void* const* buffers) {
        const CudaDriver& d = dev.driver();
        std::lock_guard<std::mutex> lock(graph_mutex);
        if (!graph_exec) {
            dev.check(d.cuGraphCreate(&graph, 0), "cuGraphCreate");
            CUhandle previous = nullptr;
            for (const CudaKernel& k : kernels) {
                graph_args.push_back(args_of(k, buffers));
                nodes.push_back(nullptr);
                if (k.blocks == 0) continue;
                std::vector<void*> params = params_of(graph_args.back());
                CudaKernelNodeParams n = node_params(k, params);
                dev.check(d.cuGraphAddKernelNode(&nodes.back(), graph, &previous, previous ? 1 : 0,
                                                 &n),
                          "cuGraphAddKernelNode");
                previous = nodes.back();
            }
            dev.check(d.cuGraphInstantiate(&graph_exec, graph, 0), "cuGraphInstantiate");
        } else {
            for (size_t i = 0; i < kernels.size(); i++) {
                std::vector<void*> args = args_of(kernels[i], buffers);
                if (!nodes[i] || args == graph_args[i]) continue;
                graph_args[i] = args;
                std::vector<void*> params = params_of(graph_args[i]);
                CudaKernelNodeParams n = node_params(kernels[i], params);
                dev.check(d.cuGraphExecKernelNodeSetParams(graph_exec, nodes[i], &n),
                          "cuGraphExecKernelNodeSetParams");
            }
        }
        dev.check(d.cuGraphLaunch(graph_exec, dev.stream()), "cuGraphLaunch");
    }
    void run(void* const* buffers, int64_t* err) override {
        const CudaDriver& d = dev.driver();
        dev.check(d.cuMemsetD8Async(CUdeviceptr(err_buffer), 0, 16, dev.stream()),
                  "cuMemsetD8Async");
        for (const CudaKernel& k : kernels) {
            if (!k.zero_bytes) continue;
            dev.check(d.cuMemsetD8Async(CUdeviceptr(k.scratch[0]), 0, k.zero_bytes,
                                        dev.stream()),
                      "cuMemsetD8Async");
        }
        bool profile = env_int("TG_CUDA_PROFILE", 0, 0, 1), again = runs++ > 0;
        if (!scans && again && !profile && env_int("TG_CUDA_GRAPHS", 1, 0, 1)) {
            launch_graph(buffers);
            {
                std::lock_guard<std::mutex> lock(runtime_mutex);
                global_stats.graph_runs++;
            }
            read_err(err);
            return;
        }
        std::vector<CUhandle> marks;   // TG_CUDA_PROFILE: before each kernel, after the last
        for (const CudaKernel& k : kernels) {
            std::vector<void*> args = args_of(k, buffers);
            if (profile) marks.push_back(dev.record(/*timing=*/true));
            launch(k.fn, k.blocks, params_of(args));
            if (profile && &k == &kernels.back()) add_kernel_times(marks);
            if (!k.finite_scan) continue;
            void *x = buffers[k.finite_buffer], *e = err_buffer;
            int site = k.finite_site;
            int64_t count = k.finite_count;
            launch(k.finite_scan, (count + CUDA_BLOCK_THREADS - 1) / CUDA_BLOCK_THREADS,
                   {&x, &count, &site, &e});
            if (read_err(err)) {   // the nests after it do not run, as on the CPU
                for (CUhandle m : marks) dev.driver().cuEventDestroy(m);
                return;
            }
        }
        read_err(err);
    }
    // each kernel's time between its mark and the next (the last's to a mark after it)
    void add_kernel_times(std::vector<CUhandle>& marks) {
        const CudaDriver& d = dev.driver();
        marks.push_back(dev.record(/*timing=*/true));
        dev.check(d.cuEventSynchronize(marks.back()), "cuEventSynchronize");
        std::lock_guard<std::mutex> lock(runtime_mutex);
        for (size_t i = 0; i + 1 < marks.size(); i++) {
            float ms = 0;
            dev.check(d.cuEventElapsedTime(&ms, marks[i], marks[i + 1]), "cuEventElapsedTime");
            KernelTime& t = kernel_times()[kernels[i].name];
            t.calls++;
            t.ms += ms;
        }
        for (CUhandle m : marks) d.cuEventDestroy(m);
        marks.clear();
        static bool printed_at_exit = (std::atexit([] {
            if (env_int("TG_CUDA_PROFILE", 0, 0, 1))
                std::fputs(tg::cuda::profile_report(SIZE_MAX).c_str(), stderr);
        }), true);
        (void)printed_at_exit;
    }
};

std::shared_ptr<Executable> CudaDevice::prepare(const Program& p) {
    CudaSource source = render_cuda_kernels(p);
    const std::string& src = source.text;
    int debug = debug_level();
    // the file TG_DEBUG keeps: cuda-gdb finds the kernels' source there
    std::string name = debug >= 2 ? artifact_stem(p) + ".cu" : p.name + ".cu";
    std::string cubin = nvrtc_compile(src, arch(), name, debug >= 4);
    auto exe = std::make_shared<CudaProgram>(*this);
    const CudaDriver& d = driver();
    check(d.cuModuleLoadData(&exe->module, cubin.data()), "cuModuleLoadData");
    std::vector<Launch> launches = launches_of(p);
    std::map<size_t, void*> scratch_of;   // a split launch's, by its number
    std::vector<std::vector<size_t>> kernels = kernels_of(p, launches);
    for (size_t k = 0; k < kernels.size(); k++) {
        const std::vector<size_t>& launched = kernels[k];
        const Launch& launch = launches[launched[0]];
        const Block& b = launch.part;
        CudaKernel kernel;
        check(d.cuModuleGetFunction(&kernel.fn, exe->module, source.function[k].c_str()),
              "cuModuleGetFunction");
        kernel.buffers = source.buffers[k];
        kernel.offsets = source.offsets[k];
        kernel.blocks = kernel_blocks(p, launches, launched);
        kernel.name = artifact_stem(p) + "/" + launch.name + ": ";
        for (size_t i : launched)
            kernel.name += (i == launched[0] ? "" : " + ") + launches[i].part.title;
        for (size_t i : launched) {
            const Launch& l = launches[i];
            if (l.stage == 2) {   // a split scatter's totals: its first kernel's scratch
                kernel.scratch.push_back(scratch_of.at(i - 1));
                continue;
            }
            if (l.stage != 1) continue;
            // partial sums, then a product's or column sum's counters of arrivals
            KernelPlan split = plan_kernel(p, l.block, l.part);
            size_t sums = size_t(split.splits * split.outputs) * sizeof(float);
            size_t counters = split.serial ? 0 : size_t(split.items / split.splits) * 4;
            void* scratch = alloc(sums + counters);
            kernel.scratch.push_back(scratch);
            kernel.owned.push_back(scratch);
            scratch_of[i] = scratch;
            if (split.serial)
                kernel.zero_bytes = sums;
            else
                check(d.cuMemsetD8Async(CUdeviceptr(scratch) + sums, 0, counters, stream()),
                      "cuMemsetD8Async");
        }
        kernel.finite_site = b.finite_site;
        kernel.finite_buffer = b.finite_buffer;
        kernel.finite_count = b.finite_count;
        if (b.finite_site >= 0) {
            exe->scans = true;
            bool f32 = p.buffers[size_t(b.finite_buffer)].dtype == DType::FLOAT32;
            check(d.cuModuleGetFunction(&kernel.finite_scan, exe->module,
                                        f32 ? "tg_finite_float" : "tg_finite_double"),
                  "cuModuleGetFunction");
        }
        exe->kernels.push_back(kernel);
    }
    return exe;
}

// ---- [NCCL] sums across processes ------------------------------------------------------------
struct NcclUniqueId { char internal[128]; };   // ncclUniqueId, passed by value
struct NcclLibrary {
    int (*ncclGetUniqueId)(NcclUniqueId*);
    int (*ncclCommInitRank)(void**, int, NcclUniqueId, int);
    int (*ncclCommDestroy)(void*);
    int (*ncclAllReduce)(const void*, void*, size_t, int, int, void*, CUhandle);
    int (*ncclGroupStart)();
    int (*ncclGroupEnd)();
    const char* (*ncclGetErrorString)(int);
};
enum : int { NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_SUM = 0 };

// Loaded at first use; a failure is not kept, so a later call may find the library.
static const NcclLibrary& nccl_library() {
    static std::mutex m;
    static NcclLibrary lib;
    static bool loaded = false;
    std::lock_guard<std::mutex> lock(m);
    if (loaded) return lib;
    std::string named = env_str("TG_NCCL_LIBRARY", ""), why;
    std::vector<const char*> names = {"libnccl.so.2", "libnccl.so"};
    if (!named.empty()) names = {named.c_str()};
#define TG_SYM(name) {#name, reinterpret_cast<void**>(&lib.name)}
    loaded = open_library(names,
                          {TG_SYM(ncclGetUniqueId), TG_SYM(ncclCommInitRank),
                           TG_SYM(ncclCommDestroy), TG_SYM(ncclAllReduce), TG_SYM(ncclGroupStart),
                           TG_SYM(ncclGroupEnd), TG_SYM(ncclGetErrorString)},
                          why);
#undef TG_SYM
    if (!loaded)
        fail("NCCL: " + why + "; NCCL comes with the CUDA toolkit or as the package libnccl2 "
             "(TG_NCCL_LIBRARY names the library file)");
    return lib;
}
static void nccl_check(const NcclLibrary& lib, int r, const char* call) {
    if (r) fail(strf("NCCL: %s failed: %s (error %d)", call, lib.ncclGetErrorString(r), r));
}

static const bool cuda_registered = [] {
    register_device("CUDA", &cuda_device());
    register_device_kind("CUDA", [](int ordinal) -> Device* { return new CudaDevice(ordinal); });
    return true;
}();

}  // namespace detail

namespace cuda {
bool available(std::string* why) {
    try {
        detail::cuda_device().driver();
        return true;
    } catch (const Error& e) {
        if (why) *why = e.what();
        return false;
    }
}
bool nvrtc_available(std::string* why) { return detail::nvrtc(why) != nullptr; }
void synchronize() { detail::cuda_device().synchronize(); }
static detail::CudaDevice& cuda_device_named(const char* what, const std::string& name) {
    auto* gpu = dynamic_cast<detail::CudaDevice*>(&detail::device(name));
    if (!gpu) detail::fail(std::string(what) + ": " + name + " is not a CUDA device");
    return *gpu;
}
std::string gpu_name(const std::string& device_name) {
    return cuda_device_named("gpu_name", device_name).gpu_name();
}
std::string profile_report(size_t top) {
    using namespace detail;
    std::lock_guard<std::mutex> lock(runtime_mutex);
    const std::map<std::string, KernelTime>& times = kernel_times();
    if (times.empty()) return "";
    std::vector<std::pair<double, const std::string*>> order;
    double total = 0;
    for (auto& [name, t] : times) {
        order.push_back({t.ms, &name});
        total += t.ms;
    }
    std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::string out = strf("[tg] CUDA kernel times (TG_CUDA_PROFILE): %zu kernels, %.3f ms in all\n"
                           "      total ms  share   calls   mean us  program/kernel: nest\n",
                           times.size(), total);
    for (size_t i = 0; i < order.size() && i < top; i++) {
        const KernelTime& t = times.at(*order[i].second);
        out += strf("    %10.3f %5.1f%% %7lld %9.1f  %s\n", t.ms, 100 * t.ms / total,
                    (long long)t.calls, 1000 * t.ms / double(t.calls), order[i].second->c_str());
    }
    return out;
}

struct Event::State {
    detail::CudaDevice* dev = nullptr;
    detail::CUhandle event = nullptr;
    ~State() {
        if (event) dev->driver().cuEventDestroy(event);
    }
};
Event::Event(const std::string& device_name) : state_(std::make_shared<State>()) {
    detail::CudaDevice& dev = cuda_device_named("Event", device_name);
    state_->event = dev.record(/*timing=*/true);
    state_->dev = &dev;
}
bool Event::done() const {
    detail::CudaDevice& dev = *state_->dev;
    detail::CUresult r = dev.driver().cuEventQuery(state_->event);
    if (r == detail::CUDA_ERROR_NOT_READY) return false;
    dev.check(r, "cuEventQuery");
    return true;
}
void Event::synchronize() const {
    state_->dev->check(state_->dev->driver().cuEventSynchronize(state_->event),
                       "cuEventSynchronize");
}
void Event::happens_before(const std::string& device_name) const {
    cuda_device_named("Event::happens_before", device_name).wait(state_->event);
}
double Event::milliseconds_since(const Event& earlier) const {
    synchronize();
    earlier.synchronize();
    float ms = 0;
    state_->dev->check(state_->dev->driver().cuEventElapsedTime(&ms, earlier.state_->event,
                                                                 state_->event),
                       "cuEventElapsedTime");
    return ms;
}

std::string nccl_unique_id() {
    const detail::NcclLibrary& lib = detail::nccl_library();
    detail::NcclUniqueId id;
    detail::nccl_check(lib, lib.ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string hex;
    for (char c : id.internal) hex += strf("%02x", unsigned(static_cast<unsigned char>(c)));
    return hex;
}

struct Nccl::State {
    const detail::NcclLibrary* lib;
    detail::CudaDevice* dev;
    void* comm = nullptr;
    int rank, ranks;
    ~State() {
        if (comm) lib->ncclCommDestroy(comm);
    }
};

Nccl::Nccl(int rank, int ranks, const std::string& unique_id, const std::string& device_name)
    : state_(std::make_shared<State>()) {
    using namespace detail;
    if (ranks < 1 || rank < 0 || rank >= ranks)
        fail(strf("NCCL: rank %d of %d ranks (a rank is 0 to ranks - 1)", rank, ranks));
    NcclUniqueId id;
    bool hex = unique_id.size() == 2 * sizeof id.internal &&
               unique_id.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex)
        fail(strf("NCCL: the unique id must be %zu lowercase hex digits, as nccl_unique_id() "
                  "gives it; got %zu characters", 2 * sizeof id.internal, unique_id.size()));
    for (size_t i = 0; i < sizeof id.internal; i++)
        id.internal[i] = char(std::stoi(unique_id.substr(2 * i, 2), nullptr, 16));
    State& st = *state_;
    st.dev = dynamic_cast<CudaDevice*>(&detail::device(device_name));
    if (!st.dev) fail("NCCL: " + device_name + " is not a CUDA device");
    st.lib = &nccl_library();
    st.dev->driver();   // the GPU's context, current on this thread for NCCL
    st.rank = rank;
    st.ranks = ranks;
    nccl_check(*st.lib, st.lib->ncclCommInitRank(&st.comm, ranks, id, rank), "ncclCommInitRank");
}

Nccl Nccl::from_environment(const std::string& device_name) {
    using namespace detail;
    const char* needs = "NCCL: set TG_NCCL_RANK and TG_NCCL_RANKS (this process's rank, 0 to "
                        "ranks - 1, and the number of processes)";
    int ranks = env_int("TG_NCCL_RANKS", 0, 1, 1 << 20);
    if (ranks == 0) fail(needs);
    int rank = env_int("TG_NCCL_RANK", -1, 0, ranks - 1);
    if (rank < 0) fail(needs);
    std::string id = env_str("TG_NCCL_ID", ""), file = env_str("TG_NCCL_ID_FILE", "");
    if (id.empty() && file.empty())
        fail("NCCL: set TG_NCCL_ID (from tg::cuda::nccl_unique_id()) or TG_NCCL_ID_FILE (rank 0 "
             "writes the id there)");
    if (id.empty() && rank == 0) {
        id = nccl_unique_id();
        write_file_atomic(file, id);
    }
    for (int waited = 0; id.empty(); waited += 10) {
        if (read_file(file, id) && id.size() == 256) break;
        id.clear();
        if (waited >= 60000)
            fail(strf("NCCL: rank %d waited 60 s for the id in %s (rank 0 writes it)", rank,
                      file.c_str()));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Nccl(rank, ranks, id, device_name);
}

void Nccl::all_reduce_sum(const std::vector<Tensor>& tensors) {
    using namespace detail;
    State& st = *state_;
    for (const Tensor& t : tensors) {
        const Buffer* b = t.node()->buffer.get();
        bool floats = t.dtype() == DType::FLOAT32 || t.dtype() == DType::FLOAT64;
        if (!b || b->device != st.dev || !floats)
            fail(strf("NCCL: all_reduce_sum takes float32 or float64 tensors realized on %s, "
                      "got %s %s%s on %s", st.dev->name(), dtype_name(t.dtype()),
                      shape_str(t.shape()).c_str(), b ? "" : " (not realized)",
                      t.device().c_str()));
    }
    st.dev->driver();   // its context, current on this thread
    nccl_check(*st.lib, st.lib->ncclGroupStart(), "ncclGroupStart");
    for (const Tensor& t : tensors) {
        Buffer& b = *t.node()->buffer;
        nccl_check(*st.lib, st.lib->ncclAllReduce(b.ptr, b.ptr, size_t(b.numel),
                                                  b.dtype == DType::FLOAT32 ? NCCL_FLOAT32
                                                                            : NCCL_FLOAT64,
                                                  NCCL_SUM, st.comm, st.dev->stream()),
                   "ncclAllReduce");
    }
    nccl_check(*st.lib, st.lib->ncclGroupEnd(), "ncclGroupEnd");
    st.dev->synchronize();
    uint64_t now = ++update_count;   // written in place, as a program's update
    for (const Tensor& t : tensors) t.node()->buffer->written_at = now;
}

DataParallel::AllReduce Nccl::all_reduce() {
    Nccl self = *this;
    return [self](const std::vector<Tensor>& grads) mutable { self.all_reduce_sum(grads); };
}
int Nccl::rank() const { return state_->rank; }
int Nccl::ranks() const { return state_->ranks; }
}  // namespace cuda
}  // namespace tg

#endif  // TINYGRAD_CUDA_IMPLEMENTATION_DONE
