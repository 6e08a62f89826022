/* tinygrad.hpp — a deep-learning compiler in one header.                      >>manual
   MIT license (end of file). Part A: manual. Part B: API. Part C: implementation.

   Write PyTorch-like tensor code; it is recorded lazily as a graph of a few primitive ops,
   fused into kernels, lowered to loops, emitted as C, compiled by the system C compiler,
   loaded with dlopen and run. Every stage can be printed.

 QUICK START
   In exactly one .cpp file:
       #define TINYGRAD_IMPLEMENTATION
       #include "tinygrad.hpp"
       using tg::Tensor;
       int main() {
           Tensor a = Tensor::randn({64, 32}, 1), b = Tensor::randn({32, 16}, 2);
           Tensor c = (a.matmul(b) + 1.0f).relu().sum(1);   // lazy: nothing has run yet
           std::vector<float> v = c.to_vector();            // schedule, loop IR, C, cc, dlopen, run
           std::cout << c << "\n";                           // tensor([33.9993, ...])
       }
   Build: c++ -std=c++17 -O2 main.cpp -ldl        Other files include it without the define.
   That file takes about 20 s at -O2: in a project, give the define a file of its own
   (tinygrad_impl.cpp), compile it once and link it (README.md, Build time).

 TRAINING (examples/03_moons.cpp in full)
       tg::nn::Sequential mlp(tg::nn::Linear(2, 16), tg::nn::ReLU(), tg::nn::Linear(16, 1));
       tg::optim::SGD opt(mlp.parameters(), 0.1);
       tg::Jit step([&](const std::vector<Tensor>& in) {       // in[0]: a batch of indices
           Tensor loss = tg::nn::hinge_loss(mlp(X[in[0]]).reshape({-1}), Y[in[0]]);
           opt.zero_grad();
           loss.backward();                                      // lazy gradients
           opt.step();                                           // in-place updates
           return loss;
       });
       for (const Tensor& idx : tg::data::batches(n, 32, epoch)) step({idx});
   The first call traces forward, backward and update into one program (one compile); later
   calls only run it. Without the jit the same code runs eagerly, one program per step; from
   the second step on, that program is found by the structure of the step's graph, so an
   eager step skips scheduling and compiling (W2: about 1.3x the jitted step's time, its
   program running in the background while the next step's graph is built). A new process
   finds there, in the cache directory, the programs an earlier one built for the same graphs.

 DATA PARALLEL (examples/07_data_parallel.cpp)
       tg::DataParallel step({"CPU:0", "CPU:1"}, opt, [&](const std::vector<Tensor>& shard) {
           return tg::nn::hinge_loss(mlp(X[shard[0]]).reshape({-1}), Y[shard[0]]);
       });                                                       // the mean loss of the shard
       for (const Tensor& idx : tg::data::batches(n, 32, epoch)) step({idx});
   Each call splits the batch by rows over the devices, runs the forward and backward of every
   shard at once (each device its own queue thread and threads()/N threads), merges the
   gradients pairwise in a fixed tree and updates the parameters once, on the first device.
   The result equals one device's within float rounding, with the same bits on every run;
   [PARALLEL] states the rule. Across processes (one per GPU): DataParallel::all_reduce with
   tg::cuda::Nccl (cuda_backend.hpp).

 HOW IT WORKS (sections of Part C, in pipeline order; grep the >>tag)
   Tensor API ──► graph of primitive ops          [GRAPH] >>graph, [COMPOSED] >>composed
                  (shapes inferred, errors thrown here)
                          │ + autograd: more graph          [AUTOGRAD] >>autograd
                          │ realize() / jit                 [REALIZE] >>realize, [JIT] >>jit
                          ▼
                  scheduler: which nodes get buffers, kernels     [SCHEDULE] >>schedule
                  (a cost model: recompute or store)
                          ▼
                  loop IR: loops, accumulators, stores            [LOOPIR] >>loopir
                  + passes (simplify, fuse loops, substitute,     [PASSES] >>passes
                    dead stores, plan memory; TG_PASSES)
                          ▼
                  INTERP: interpreter over the IR, or             [INTERP] >>interp
                  C renderer → cc → disk cache → dlopen → run     [RENDER] [RUNTIME]
                  (or CUDA C → NVRTC → driver API: cuda_backend.hpp, a second header)
   Data flows down; nothing below knows about anything above it. On top of the Tensor API
   only: [NN] layers and losses, [OPTIM], [DATA] datasets, [PLOT], [SAFETENSORS]; on top of
   [OPTIM] and the devices' queues: [PARALLEL] >>parallel, data-parallel steps.

 DEFINITIONS
   shape     dimensions of a tensor, outermost first; [] is a scalar.
   view      how a movement op (reshape, permute, expand, pad, shrink, flip) reads its source.
             Views are index functions: lowering maps each output index expression to a source
             index expression (pad adds a validity condition) and the simplifier, which knows
             every loop variable's range, folds the composition back to strides and offsets.
             Where a ShapeTracker would need a stack of views (a reshape of a permuted tensor,
             say), the index keeps its / and %; nothing is ever copied for a view. A range of
             rows of a realized tensor (x.slice(0, a, b): a batch of a dataset) is a part of
             its buffer instead, so the programs reading it do not depend on a and b.
   realize   run the pipeline for some tensors, so that they hold a buffer (a constant, such as
             zeros() or ones(), is filled without a program).
   buffer    memory of one realized tensor (or of a temporary inside one program).
   kernel    one loop nest that stores one buffer. Elementwise ops fuse into it, broadcast
             operands are read through stride-0 indices, and a reduction fuses with its
             elementwise producers and consumers (matmul + bias + relu is one kernel).
   loop IR   a program: blocks (one per kernel) of loops, accumulators and stores, with small
             expression trees for values and indices.
   program   all kernels of one realize: one C file, one compiler call, one dlopen (with 32 KB
             of C or more and two cores, two files compiled at once and linked into one library).
             Kernels of the same code over other buffers, or other offsets of one (a model's
             layers, a recurrent layer's steps), share a function; sum trees of the same code
             over other buffers in one product (a recurrent weight's gradient) run as a loop.
   gradient  backward() applies one rule per primitive, building more lazy graph: gradients
             fuse with the forward pass and the update and can be differentiated again.
             The loss and the new gradients are realized with the next program (the
             optimizer's step), computed from the parameters before the update.
   leaf      a tensor requires_grad() was called on (any tensor not computed from a leaf can
             become one); backward() accumulates into its grad(). A lazy leaf (randn(...)
             .requires_grad()) is computed, with the others, just before the next program.
   assign    x.assign(v) writes v into x's buffer when realized: optimizers update in place.
             A view of x sees the new value; a computed tensor built before the update and
             realized after it would not have existed in PyTorch, which computes at once: it
             is an error ("stale read"), as are two assigns to one buffer in one realize.
   jit       tg::Jit records every realize of a step function into one program and replays
             it on new inputs, building no graph. A learning rate or step count that changes
             lives in a tensor, so replays see it; so does nn::Dropout's count of masks drawn
             (the RAND op adds an optional integer source to its seed), and nn::BatchNorm's
             running statistics, assigned and realized in its forward.
   device    where a tensor lives and is computed: CPU, INTERP or, with cuda_backend.hpp,
             CUDA. A tensor is made on the default device ($TG_DEVICE) and an op runs on its
             operands' device; a constant goes where it is used; operands on two devices are
             an error. x.to("CUDA") copies; moving a leaf gives a leaf there. One realize
             runs one program per device. Several devices of a kind are numbered: CPU:1,
             CPU:2, ... (made when first named; each its own buffers, queue and thread pool),
             CUDA:1, ...; CPU:0 is CPU and CUDA:0 is CUDA.
   queue     a device's stream: work (DataParallel's programs, copies between devices) runs
             there in order, on the queue's thread; an event is a point in a queue that work
             on another queue can wait for (Device::queue(), WorkQueue).
   background  an optimizer's step on the CPU queues its program and returns, so the next
             step's graph is built while it runs (up to two steps in flight; TG_SYNC=1, or a
             step of little work: it runs before step() returns). Reading what it may use, a
             program run at once on the device, the step two after it, a Jit or DataParallel
             step and tg::synchronize() wait for it; a bounds check it failed is thrown once
             by the first of them and by every read of a tensor it computed, and the step
             queued behind it does not run. The parameters' initializers, realized together
             before the first program that uses them, are compiled and run there too where
             they need a compile, so the host builds and compiles that program meanwhile;
             a realize() returns with them done, and if their compile fails, the parameters
             throw its error when read.

 CONFIGURATION (environment, read when used)
   TG_DEVICE     CPU (default: C + cc + dlopen), INTERP (the loop-IR interpreter, no
                 compiler) or CUDA (with cuda_backend.hpp); any case
   TG_CC         C compiler                                   default: cc
                 (one that crashes on a program is asked again at -O1: the same results)
   TG_CFLAGS     optimization flags                           default: -O3 -march=native
                 (-fPIC -shared -fno-math-errno -ffp-contract=off are always added, so a
                 value computed twice is the same bits, and -nostdlib -lm: a program is
                 linked with libm alone, unless the flags instrument it (-fsanitize,
                 -fprofile, --coverage, -fopenmp); with GCC also -fno-tree-slp-vectorize,
                 as GCC 12's SLP vectorizer drops float32 roundings, and -mno-avx512vl where
                 the flags enable AVX-512VL, as its loop vectorizer then miscompiled a
                 compare of loop indices). Set, it builds every program, and no program has
                 a quick build.
   TG_QUICK_RUNS a program of little work (up to 2^25 statements run, loops counted) is built
                 quickly first (-O0 -march=native: a fifth of the compile time, code up to
                 20x slower; the same bits); at its TG_QUICK_RUNS-th run (default 2) its
                 optimized build starts on a background thread, and the runs after it is
                 ready use it. 0: build every program optimized at once. tg::finish_compiles()
                 waits for the background builds (benchmarks call it before timing).
   TG_CACHE_DIR  compiled programs   default: $XDG_CACHE_HOME/tinygrad, else ~/.cache/tinygrad
                 It holds code this process loads, so it must be the user's own and writable
                 by nobody else (else an error says how to fix it). Entries are keyed by the
                 source, the compiler (its file's path, size, inode and time; a TG_CC with
                 arguments by its --version), its flags and the macros the flags predefine (so what
                 -march=native resolved to). It also keeps each CPU program's run (buffers,
                 checks, C files) under its graph's structure, so a process that builds a graph
                 an earlier one built skips scheduling, lowering and the passes (lowered-*.bin).
   TG_DEBUG      0-4. 1 programs, compiles, cache hits, timings   2 + schedule, and keeps each
                 program's graph listing, loop IR and C in the cache dir as NAME-HASH.{graph,ir,c}
                 3 + loop IR before and after the passes       4 + the generated C source
                 (CUDA: NAME-HASH.cu, and at 4 kernels with debug and line information)
   TG_NVRTC_FLAGS  CUDA: more NVRTC options, space-separated (part of the cache key)
   TG_CUDA_GRAPHS  CUDA: 0 runs each program kernel by kernel (default 1: from its second
                 run, as one CUDA graph)
   TG_CUDA_TILE  CUDA: 32, 64 or 128, the side of a product's tile of outputs (default: by
                 the product's size)
   TG_CUDA_PRODUCT_BLOCKS  CUDA: the blocks per multiprocessor a product's kernel is compiled
                 for (default 1; 2 caps a thread's registers at 128, and 128 x 128 tiles
                 then stage 8 terms at a time, not 16: a variant to time)
   TG_CUDA_TF32  CUDA: 1 runs float32 products (matmuls) on tensor cores, their operands
                 rounded to TF32 (10 fraction bits), as PyTorch's allow_tf32 (default 0: off)
   TG_CUDA_LIBRARY, TG_NVRTC_LIBRARY  CUDA: the driver's and NVRTC's library files (default
                 libcuda.so.1, libnvrtc.so; make test names tests/cuda_on_cpu.cpp's)
   TG_PASSES     loop passes to run, comma-separated (simplify,fuse_loops,fuse_maps,
                 substitute_temps,dead_stores,first_write,order_nests,local_temps,
                 tile_products,sum_lanes,split_divided,split_at_edges,parallel_loops,
                 plan_memory);
                 default all (each device runs those that suit it);
                 none runs the IR as lowered (to bisect a wrong result to a pass)
   TG_TILE_MIN_WORK  the fewest multiply-adds of a matrix product computed in tiles, on the
                 CPU and on CUDA (default 32768; the oracle uses 1 to tile every product)
   TG_THREADS    threads for nests whose outer iterations write disjoint parts (default:
                 the machine's cores); results are the same bits for any count
   TG_PARALLEL_MIN_WORK  the least work of a nest run on threads: iterations, loops counted
                 (default 65536), or a tiled product's multiply-adds (default 2^21); the
                 oracle's thread check uses 1 to run every such nest in chunks
   TG_CHECK      1: every kernel's float output is checked for NaN and infinity; the first
                 kernel that produces one stops the program with its element and user line
   TG_SYNC       1: an optimizer's step runs before step() returns, so its errors are thrown
                 there (default 0: it runs in the background, see "background"; TG_DEBUG >= 1
                 also runs it at once)
   TG_BACKGROUND_MIN_WORK  the fewest statements run (loops counted) of a step that runs in
                 the background (default 2^21: W2's step counts 5.9 million; a smaller step
                 runs at once, as its hand-over would cost more than it saves)

 DTYPES AND PROMOTION
   float32 (default), float64, int32, int64, bool. Tensor-tensor ops promote to the wider of
   the two (bool < int32 < int64 < float32 < float64); a scalar takes the tensor's dtype unless
   it is a float and the tensor is not (then float32), or an integer (not a C++ bool) next to
   bool (then int64: mask + 1 counts), like PyTorch. Division and transcendental functions of
   integers give float32. Comparisons give bool. Sums of integers and bools are int64, and so
   are indices (argmax, argmin, x.max(axis).indices, topk), as in PyTorch.
   Values, the same on every device: integer arithmetic wraps around (two's complement), an
   integer x % 0 is 0 (PyTorch raises); a / b is IEEE division, correctly rounded as
   PyTorch's (21/7 is 3, not 21·(1/7)), and a float % is exact for quotients below 2^53;
   a float cast to an integer truncates and saturates at the ends of the range, NaN giving 0
   (NaN cast to bool is true);
   NaN propagates through max, min, argmax (the first NaN), maximum, minimum and relu; every
   NaN reads as the same NaN. A float sum is a fixed tree of partial sums of at most 16 terms,
   so its error grows with the logarithm of the length; a term that is a product x·y joins its
   partial sum as one fused multiply-add, fma(x, y, sum), rounded once. A sum has the same bits
   on the CPU (any thread count) and INTERP. On CUDA a long sum with few outputs is split over
   a block of threads and combined in a fixed tree: the same bits on every run, not the CPU's.
   The CPU computes matrix products (and sums of columns) in tiles: many element sums at once
   in vector registers, each still its own tree in its own order, so tiling changes speed,
   never bits (pass tile_products; TG_DEBUG=4 shows the C).

 HOW TO ADD AN OP
   Most ops are compositions: write a Tensor method in [COMPOSED] from existing ones.
   A new primitive needs: a row in TG_OPS (Part B), shape inference in [GRAPH] (graph_unary,
   graph_binary, ...), a case in lowering ([LOOPIR] Lowering::lower_new), its gradient in
   [AUTOGRAD] and, for new arithmetic, a case in alu_eval ([SHAPES]) and its C form in the
   TG_OPS row. Tests: tests/test_ops.cpp compares every op with a double-precision loop.

 ERRORS
   Every invalid call throws tg::Error naming the op, the shapes and the caller's file:line
   (operators too, through the conversion of their left operand to tg::Operand):
       matmul: [32,30] @ [20,200]: inner dims 30 != 20 (at main.cpp:7)
   A failing compile reports the command, the compiler's output and the kept source path. An
   index out of range is found when the program runs; the program then stops before its
   in-place writes, and the error names the line that indexed.

 NOT YET
   CUDA products at cuBLAS's speed (the tiled kernels: 29 of its 51 TFLOP/s at 4096^3 on an
   H200) and TF32; fast tiles on x86 CPUs without AVX-512 (with AVX2 and FMA they run at a
   fraction of the AVX-512 rate; without FMA the fused multiply-adds are library calls).
   Several CUDA devices (CUDA:1, ...) and their peer copies, and NCCL across processes, are
   written but have not run on real GPUs (a one-rank NCCL step has).
   The interpreter and constant folding hold integers exactly, but a constant in the graph
   (Scalar) is a double: int64 constants beyond 2^53 are rounded.
*/

/* =============================================================================================
   Part B: the public API
   ============================================================================================= */
#ifndef TINYGRAD_HPP_INCLUDED
#define TINYGRAD_HPP_INCLUDED

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tg {

// ---- [TYPES] dtypes, shapes, errors, source locations ----------------------------------- >>types

// Ordered by promotion. INDEX is the loop IR's int64 index arithmetic, never a tensor dtype.
enum class DType : uint8_t { BOOL, INT32, INT64, FLOAT32, FLOAT64, INDEX };
const char* dtype_name(DType dt);
size_t dtype_size(DType dt);
bool dtype_is_float(DType dt);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);            // "[64,32]"

struct Error : std::runtime_error {
    explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Where the user built a node. Every API call takes it as a defaulted last argument, so the
// caller's file:line reaches error messages and comments in the generated C.
// (Not an aggregate, so that a braced list such as sum({0, 2}) never reads as a Loc.)
struct Loc {
    const char* file;
    int line;
    constexpr Loc() : file(nullptr), line(0) {}
    static constexpr Loc here(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
        Loc loc;
        loc.file = f;
        loc.line = l;
        return loc;
    }
};

// A number on one side of an operator: remembers whether it was written as a float.
struct Scalar {
    double value;
    bool is_float, is_bool;
    template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
    Scalar(T v)
        : value(static_cast<double>(v)),
          is_float(std::is_floating_point_v<T>),
          is_bool(std::is_same_v<T, bool>) {}
};

// ---- [OPS] the primitive op set, described once ------------------------------------------- >>ops
// Everything else (matmul, softmax, einsum, ...) is composed from these. The C column is the
// renderer's form: {0} {1} {2} operands, {f} the libm suffix ("f" for float32), {t} the C type.
// SCATTER_MAX joins DESIGN.md's set: scatter's last write (the largest position that names a
// place), scatter_reduce's amax and amin and max_unpool have no composition of the others in
// less than index-length × axis-length work (each place compared with every index); it is
// SCATTER_ADD's loop with max= for +=, and its gradient is composed (gather, scatter_add).
#define TG_OPS(X)                                                                              \
    X(BUFFER,      SOURCE,   "")                   /* realized data                          */ \
    X(CONST,       SOURCE,   "")                   /* one value broadcast to any shape       */ \
    X(ARANGE,      SOURCE,   "")                   /* int32 0,1,...,n-1                      */ \
    X(RAND,        SOURCE,   "tg_rand({0}, {1})")  /* [0,1) from (seed [+ src], index)      */ \
    X(NEG,         UNARY,    "(-{0})")                                                         \
    X(EXP2,        UNARY,    "tg_exp2{f}({0})")                                                \
    X(LOG2,        UNARY,    "tg_log2{f}({0})")                                                \
    X(SIN,         UNARY,    "sin{f}({0})")                                                    \
    X(COS,         UNARY,    "cos{f}({0})")        /* not sin(x + π/2): exact for large x    */ \
    X(SQRT,        UNARY,    "sqrt{f}({0})")                                                   \
    X(RECIP,       UNARY,    "(1/{0})")                                                        \
    X(CAST,        UNARY,    "(({t}){0})")         /* float → int saturates, NaN → 0         */ \
    X(ADD,         BINARY,   "({0} + {1})")        /* integers wrap around, as in PyTorch    */ \
    X(MUL,         BINARY,   "({0} * {1})")                                                    \
    X(MAX,         BINARY,   "tg_max{f}({0}, {1})") /* NaN if either is NaN                  */ \
    X(CMPLT,       BINARY,   "({0} < {1})")                                                    \
    X(CMPEQ,       BINARY,   "({0} == {1})")                                                   \
    X(DIV,         BINARY,   "({0} / {1})")        /* IEEE; integers truncate like C         */ \
    X(MOD,         BINARY,   "({0} % {1})")                                                    \
    X(WHERE,       TERNARY,  "({0} ? {1} : {2})")                                              \
    X(REDUCE_SUM,  REDUCE,   "")                   /* over a set of axes, keeping them as 1  */ \
    X(REDUCE_MAX,  REDUCE,   "")                                                               \
    X(RESHAPE,     MOVEMENT, "")                   /* movement ops are views: no copy        */ \
    X(PERMUTE,     MOVEMENT, "")                                                               \
    X(EXPAND,      MOVEMENT, "")                                                               \
    X(PAD,         MOVEMENT, "")                   /* zeros outside                          */ \
    X(SHRINK,      MOVEMENT, "")                                                               \
    X(FLIP,        MOVEMENT, "")                                                               \
    X(GATHER,      INDEXED,  "")                   /* out[i] = src[i with axis := index[i]]  */ \
    X(SCATTER_ADD, INDEXED,  "")                   /* out[.. index[i] ..] += src[i]; gather' */ \
    X(SCATTER_MAX, INDEXED,  "")                   /* the same with max, from the lowest     */ \
    X(ASSIGN,      ASSIGN,   "")                   /* write a value into an existing buffer  */ \
    X(CONTIGUOUS,  SCHEDULE, "")                   /* value unchanged; gets its own buffer   */

enum class OpKind : uint8_t {
    SOURCE, UNARY, BINARY, TERNARY, REDUCE, MOVEMENT, INDEXED, ASSIGN, SCHEDULE
};
enum class Op : uint8_t {
#define TG_OP_ENUM(name, kind, c) name,
    TG_OPS(TG_OP_ENUM)
#undef TG_OP_ENUM
};
const char* op_name(Op op);
OpKind op_kind(Op op);

namespace detail { struct Node; }
class Tensor;
struct ValuesIndices;
struct Unique;

// The left operand of an operator (a + b, -a) or the index of x[i]. An operator cannot take a
// defaulted location argument, but the implicit conversion to this type can: it runs at the
// user's line, so the nodes and errors of operators carry that line too.
struct Operand {
    const Tensor& tensor;
    Loc loc;
    Operand(const Tensor& t, Loc l = Loc::here()) : tensor(t), loc(l) {}
};
struct Index {
    int64_t i;
    Loc loc;
    template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
    Index(I value, Loc l = Loc::here()) : i(int64_t(value)), loc(l) {}
};

// ---- [TENSOR] the lazy tensor ---------------------------------------------------------- >>tensor
// A Tensor is a handle to a graph node; copying it is cheap and shares the node. Every method
// builds graph; nothing runs until realize(), item(), to_vector() or printing.
class Tensor {
public:
    Tensor() = default;                                // undefined until assigned
    explicit Tensor(std::shared_ptr<detail::Node> node) : node_(std::move(node)) {}

    // creation
    static Tensor zeros(const Shape& shape, DType dtype = DType::FLOAT32, Loc loc = Loc::here());
    static Tensor ones(const Shape& shape, DType dtype = DType::FLOAT32, Loc loc = Loc::here());
    static Tensor full(const Shape& shape, Scalar value, DType dtype = DType::FLOAT32,
                       Loc loc = Loc::here());
    static Tensor arange(Scalar stop, Loc loc = Loc::here());            // int32 unless a float
    static Tensor arange(Scalar start, Scalar stop, Scalar step = 1, Loc loc = Loc::here());
    static Tensor eye(int64_t n, DType dtype = DType::FLOAT32, Loc loc = Loc::here());
    // steps values from start to end, both included (float32), as torch.linspace
    static Tensor linspace(double start, double end, int64_t steps, Loc loc = Loc::here());
    static Tensor rand(const Shape& shape, uint64_t seed = next_seed(), Loc loc = Loc::here());
    static Tensor randn(const Shape& shape, uint64_t seed = next_seed(), Loc loc = Loc::here());
    // int64 uniform in [low, high), from 48 random bits a value
    static Tensor randint(int64_t low, int64_t high, const Shape& shape,
                          uint64_t seed = next_seed(), Loc loc = Loc::here());
    static Tensor from_vector(const std::vector<float>& values, const Shape& shape = {-1},
                              Loc loc = Loc::here());   // {-1}: 1-D; {}: a scalar
    static Tensor from_vector(const std::vector<double>& values, const Shape& shape = {-1},
                              Loc loc = Loc::here());
    static Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape = {-1},
                              Loc loc = Loc::here());
    static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape = {-1},
                              Loc loc = Loc::here());
    static Tensor from_vector(const std::vector<bool>& values, const Shape& shape = {-1},
                              Loc loc = Loc::here());
    // a braced list, its dtype from its elements: from_vector({1.f, 2.f}) float32, ({1, 2})
    // int32, ({1.0, 2.0}) float64, ({true, false}) bool
    template <typename T>
    static Tensor from_vector(std::initializer_list<T> values, const Shape& shape = {-1},
                              Loc loc = Loc::here()) {
        return from_vector(std::vector<T>(values), shape, loc);
    }
    static uint64_t next_seed();                       // the global stream that manual_seed sets
    // x's shape, dtype and device; rand_like and randn_like need a float x
    static Tensor zeros_like(const Tensor& x, Loc loc = Loc::here());
    static Tensor ones_like(const Tensor& x, Loc loc = Loc::here());
    static Tensor full_like(const Tensor& x, Scalar value, Loc loc = Loc::here());
    static Tensor rand_like(const Tensor& x, uint64_t seed = next_seed(), Loc loc = Loc::here());
    static Tensor randn_like(const Tensor& x, uint64_t seed = next_seed(), Loc loc = Loc::here());

    // what it is
    const Shape& shape() const;
    const Shape& size() const { return shape(); }
    int64_t size(int axis) const;                      // negative axes count from the end
    int ndim() const;
    int dim() const { return ndim(); }
    int64_t numel() const;
    DType dtype() const;
    bool defined() const { return node_ != nullptr; }
    bool realized() const;                             // holds a buffer (computed or given)
    std::string device() const;                        // "CPU", "INTERP", "CUDA", ...
    const std::shared_ptr<detail::Node>& node() const; // the graph node (for tg::detail users)

    // elementwise (operators - + * / < <= > >= == != are free functions below)
    Tensor exp(Loc loc = Loc::here()) const;
    Tensor log(Loc loc = Loc::here()) const;
    Tensor exp2(Loc loc = Loc::here()) const;
    Tensor log2(Loc loc = Loc::here()) const;
    Tensor sqrt(Loc loc = Loc::here()) const;
    Tensor rsqrt(Loc loc = Loc::here()) const;
    Tensor reciprocal(Loc loc = Loc::here()) const;
    Tensor sin(Loc loc = Loc::here()) const;
    Tensor cos(Loc loc = Loc::here()) const;
    Tensor tanh(Loc loc = Loc::here()) const;
    Tensor sigmoid(Loc loc = Loc::here()) const;
    Tensor relu(Loc loc = Loc::here()) const;
    Tensor gelu(bool tanh_approximation = false, Loc loc = Loc::here()) const;
    Tensor silu(Loc loc = Loc::here()) const;          // x·σ(x), also called swish
    Tensor leaky_relu(double negative_slope = 0.01, Loc loc = Loc::here()) const;
    Tensor elu(double alpha = 1, Loc loc = Loc::here()) const;   // α(e^x - 1) where x <= 0
    // ln(1 + e^(βx)) / β, and x itself where βx > threshold, as PyTorch's
    Tensor softplus(double beta = 1, double threshold = 20, Loc loc = Loc::here()) const;
    Tensor sign(Loc loc = Loc::here()) const;          // -1, 0 or 1 (NaN: 0); no gradient
    Tensor abs(Loc loc = Loc::here()) const;
    Tensor square(Loc loc = Loc::here()) const;
    Tensor trunc(Loc loc = Loc::here()) const;         // toward 0; integers as they are
    Tensor floor(Loc loc = Loc::here()) const;
    Tensor ceil(Loc loc = Loc::here()) const;
    Tensor log1p(Loc loc = Loc::here()) const;         // ln(1 + x), accurate for tiny x
    Tensor expm1(Loc loc = Loc::here()) const;         // e^x - 1, accurate for tiny x
    Tensor tan(Loc loc = Loc::here()) const;           // sin x / cos x
    // composed from the primitives to within a few units in the last place of float32 and
    // float64 (tests/test_ops.cpp checks them against C's); their gradients are those of the
    // compositions: PyTorch's, finite where PyTorch's are
    Tensor atan(Loc loc = Loc::here()) const;
    Tensor asin(Loc loc = Loc::here()) const;
    Tensor acos(Loc loc = Loc::here()) const;
    Tensor atan2(const Tensor& x, Loc loc = Loc::here()) const;   // this y over x, C's atan2
    Tensor sinh(Loc loc = Loc::here()) const;
    Tensor cosh(Loc loc = Loc::here()) const;
    Tensor asinh(Loc loc = Loc::here()) const;
    Tensor acosh(Loc loc = Loc::here()) const;
    Tensor atanh(Loc loc = Loc::here()) const;
    Tensor log10(Loc loc = Loc::here()) const;
    // the error function and 1 - it, to a few ulp of float32 and within 1e-14 in float64 (erfc
    // as exp: its error grows with x²); their gradients, the compositions', within 5e-7 of
    // (2/√π)·e^(-x²) in float32 and 3e-13 in float64
    Tensor erf(Loc loc = Loc::here()) const;
    Tensor erfc(Loc loc = Loc::here()) const;
    // x·ln y, 0 where x is 0 (y not NaN), as torch.xlogy: its gradient in x is ln y, 0 where x is
    // 0 and y <= 0 (and in y, x/y, 0 there too, where PyTorch's is NaN at y = 0)
    Tensor xlogy(const Tensor& y, Loc loc = Loc::here()) const;
    // ln(x/(1 - x)) as ln x - ln(1 - x), x clamped to [eps, 1 - eps] where eps is given; NaN
    // outside [0, 1] otherwise (its gradient there is the formula's, where PyTorch's is NaN)
    Tensor logit(std::optional<double> eps = std::nullopt, Loc loc = Loc::here()) const;
    // the nearest whole number, a half to the even one (2.5 → 2, as torch.round); a zero
    // keeps x's sign; integers as they are; no gradient reaches x
    Tensor round(Loc loc = Loc::here()) const;
    // bool: NaN; ±∞; neither (integers: false, false, true), as torch.isnan, isinf, isfinite
    Tensor isnan(Loc loc = Loc::here()) const;
    Tensor isinf(Loc loc = Loc::here()) const;
    Tensor isfinite(Loc loc = Loc::here()) const;
    // NaN, +∞ and -∞ replaced: by nan, and by posinf and neginf (default: the dtype's largest
    // and lowest finite values), as torch.nan_to_num; the gradient passes where x is finite
    Tensor nan_to_num(double nan = 0, std::optional<double> posinf = std::nullopt,
                      std::optional<double> neginf = std::nullopt, Loc loc = Loc::here()) const;
    // C's remainder, with x's sign (torch.fmod; % takes other's sign): exact, as %
    Tensor fmod(const Tensor& other, Loc loc = Loc::here()) const;
    Tensor fmod(Scalar other, Loc loc = Loc::here()) const;
    // ⌊x / other⌋ as Python's // and torch.floor_divide (1 // 0.1 is 9: 0.1f is above 1/10);
    // integers stay integers (x // 0 is 0, where PyTorch raises); no gradient, as PyTorch's
    Tensor floor_divide(const Tensor& other, Loc loc = Loc::here()) const;
    Tensor floor_divide(Scalar other, Loc loc = Loc::here()) const;
    // min(max(x, min), max), either bound optional; the gradient passes where
    // min <= x <= max, as in PyTorch
    Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt,
                 Loc loc = Loc::here()) const;
    Tensor clip(std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt,
                Loc loc = Loc::here()) const;
    Tensor masked_fill(const Tensor& mask, Scalar value,
                       Loc loc = Loc::here()) const;   // value where the bool mask holds
    // x + weight·(end - x), exact at weight 0 and 1 as PyTorch's
    Tensor lerp(const Tensor& end, const Tensor& weight, Loc loc = Loc::here()) const;
    Tensor lerp(const Tensor& end, double weight, Loc loc = Loc::here()) const;
    Tensor pow(const Tensor& exponent, Loc loc = Loc::here()) const;
    Tensor pow(Scalar exponent, Loc loc = Loc::here()) const;
    Tensor maximum(const Tensor& other, Loc loc = Loc::here()) const;
    Tensor maximum(Scalar other, Loc loc = Loc::here()) const;
    Tensor minimum(const Tensor& other, Loc loc = Loc::here()) const;
    Tensor minimum(Scalar other, Loc loc = Loc::here()) const;
    Tensor logical_not(Loc loc = Loc::here()) const;
    Tensor cast(DType dtype, Loc loc = Loc::here()) const;

    // reductions: all elements, one axis or several; negative axes count from the end
    Tensor sum(Loc loc = Loc::here()) const;
    Tensor sum(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor sum(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor mean(Loc loc = Loc::here()) const;
    Tensor mean(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor mean(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor max(Loc loc = Loc::here()) const;
    // along one axis: the values and (.indices) where the first of them is, as torch.max(x, 1)
    ValuesIndices max(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor max(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor min(Loc loc = Loc::here()) const;
    ValuesIndices min(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor min(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    // the k largest (smallest) along the axis, in order, and their indices; ties: the first
    // index first, NaN above +∞. k passes over the axis: meant for a small k
    ValuesIndices topk(int64_t k, int axis = -1, bool largest = true,
                       Loc loc = Loc::here()) const;
    // Π x over the axis (none given: all), as torch.prod; integers and bool in int64. A tree
    // of pairwise products (log2 n elementwise levels, no division: a zero has its gradient)
    Tensor prod(Loc loc = Loc::here()) const;
    Tensor prod(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    // x in order along the axis and where each value was (int64), as torch.sort(stable=True):
    // equal values keep their order, NaN sorts above +∞. A bitonic network over the axis
    // padded to 2^k: k(k + 1)/2 elementwise passes, each element against one other
    ValuesIndices sort(int axis = -1, bool descending = false, Loc loc = Loc::here()) const;
    Tensor argsort(int axis = -1, bool descending = false, Loc loc = Loc::here()) const;
    // The median along the axis (of an even count, the lower of the middle two) and its index,
    // as torch.median: a NaN in the row gives NaN and the first NaN's index; over all elements
    // a 0-d value. kthvalue: the k-th smallest (k from 1; NaN above +∞). Both from sort: of
    // equal values, the first in the row's order.
    Tensor median(Loc loc = Loc::here()) const;
    ValuesIndices median(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    ValuesIndices kthvalue(int64_t k, int axis = -1, bool keepdim = false,
                           Loc loc = Loc::here()) const;
    // ln Σ e^x over the axes (none given: all) without overflow; its gradient is the softmax
    Tensor logsumexp(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor logsumexp(const std::vector<int>& axes, bool keepdim = false,
                     Loc loc = Loc::here()) const;
    // bool: whether any (every) element is nonzero, NaN too; false (true) over nothing
    Tensor any(Loc loc = Loc::here()) const;
    Tensor any(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor any(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor all(Loc loc = Loc::here()) const;
    Tensor all(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor all(const std::vector<int>& axes, bool keepdim = false, Loc loc = Loc::here()) const;
    // y_i = x_0 + ... + x_i along the axis; integers sum in int64
    Tensor cumsum(int axis, Loc loc = Loc::here()) const;
    // y_i = x_0 · ... · x_i along the axis; integers in int64. log2 n passes, each the row
    // times itself shifted on by 2^pass (ones shifted in): no division, so a zero has its
    // gradient
    Tensor cumprod(int axis, Loc loc = Loc::here()) const;
    // The running largest (smallest) along the axis and where it is, as torch.cummax: of equal
    // values the last index, and a NaN, once met, is the value on (the last NaN's index). log2 n
    // elementwise passes, each pairing an element with the one 2^pass before it; the values are
    // gathered at the indices, so the gradient goes to them.
    ValuesIndices cummax(int axis, Loc loc = Loc::here()) const;
    ValuesIndices cummin(int axis, Loc loc = Loc::here()) const;
    // ln Σ_{j<=i} e^(x_j) along the axis, as torch.logcumsumexp: log2 n passes of logaddexp
    // (no overflow, and no underflow of the small terms that a shift by the largest would give)
    Tensor logcumsumexp(int axis, Loc loc = Loc::here()) const;
    Tensor argmax(Loc loc = Loc::here()) const;       // int64 index into the flattened tensor
    Tensor argmax(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor argmin(Loc loc = Loc::here()) const;
    Tensor argmin(int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    // Σ(x - mean)² / (n - correction) over the axes (all: none given); std is its root
    Tensor var(Loc loc = Loc::here()) const;
    Tensor var(int axis, int64_t correction = 1, bool keepdim = false,
               Loc loc = Loc::here()) const;
    Tensor var(const std::vector<int>& axes, int64_t correction = 1, bool keepdim = false,
               Loc loc = Loc::here()) const;
    Tensor std(Loc loc = Loc::here()) const;
    Tensor std(int axis, int64_t correction = 1, bool keepdim = false,
               Loc loc = Loc::here()) const;
    Tensor std(const std::vector<int>& axes, int64_t correction = 1, bool keepdim = false,
               Loc loc = Loc::here()) const;
    // (Σ|x|^p)^(1/p) over the axes (none given: all), p > 0; p = INFINITY: the largest |x|.
    // Its gradient is 0 where the norm is 0, as PyTorch's
    Tensor norm(double p = 2, Loc loc = Loc::here()) const;
    Tensor norm(double p, int axis, bool keepdim = false, Loc loc = Loc::here()) const;
    Tensor norm(double p, const std::vector<int>& axes, bool keepdim = false,
                Loc loc = Loc::here()) const;

    // movement: views of the same data, nothing is copied until a kernel reads them
    Tensor reshape(const Shape& shape, Loc loc = Loc::here()) const;    // one -1 is inferred
    Tensor view(const Shape& shape, Loc loc = Loc::here()) const;       // same as reshape
    Tensor permute(const std::vector<int>& order, Loc loc = Loc::here()) const;
    Tensor transpose(int axis0 = -2, int axis1 = -1, Loc loc = Loc::here()) const;
    // the axis moved to position destination, the others in their order (torch.movedim)
    Tensor movedim(int source, int destination, Loc loc = Loc::here()) const;
    Tensor t(Loc loc = Loc::here()) const;             // 0-2 axes: rows and columns swapped
    Tensor mT(Loc loc = Loc::here()) const;            // the last two axes swapped
    Tensor expand(const Shape& shape, Loc loc = Loc::here()) const;     // -1 keeps a size
    Tensor pad(const std::vector<std::pair<int64_t, int64_t>>& before_after, Scalar value = 0,
               Loc loc = Loc::here()) const;                             // one pair per axis
    Tensor shrink(const std::vector<std::pair<int64_t, int64_t>>& begin_end,
                  Loc loc = Loc::here()) const;                          // one pair per axis
    Tensor slice(int axis, int64_t start, int64_t end, int64_t step = 1,
                 Loc loc = Loc::here()) const;   // like x[start:end:step], bounds clamped
    Tensor flip(const std::vector<int>& axes, Loc loc = Loc::here()) const;
    Tensor flip(int axis, Loc loc = Loc::here()) const;
    Tensor squeeze(Loc loc = Loc::here()) const;                         // every size-1 axis
    Tensor squeeze(int axis, Loc loc = Loc::here()) const;
    Tensor unsqueeze(int axis, Loc loc = Loc::here()) const;
    Tensor flatten(int start_axis = 0, int end_axis = -1, Loc loc = Loc::here()) const;
    // the axis split into sizes (one of them may be -1: the rest), as torch.unflatten
    Tensor unflatten(int axis, const Shape& sizes, Loc loc = Loc::here()) const;
    // the windows of size elements, step apart, along the axis, as torch.Tensor.unfold: the
    // axis holds the windows, a new last axis their elements (strided views, no copy)
    Tensor unfold(int axis, int64_t size, int64_t step, Loc loc = Loc::here()) const;
    Tensor contiguous(Loc loc = Loc::here()) const;   // forces its own buffer when realized
    // the lower (upper) triangle of the last two axes: element [i, j] where j - i <= diagonal
    // (>= diagonal), 0 elsewhere
    Tensor tril(int64_t diagonal = 0, Loc loc = Loc::here()) const;
    Tensor triu(int64_t diagonal = 0, Loc loc = Loc::here()) const;
    // y[i] = x[(i - shift) mod n] along each axis given (shifts and axes in pairs)
    Tensor roll(int64_t shift, int axis, Loc loc = Loc::here()) const;
    Tensor roll(const std::vector<int64_t>& shifts, const std::vector<int>& axes,
                Loc loc = Loc::here()) const;
    // x.repeat({2, 3}): tiles of x, repeats.size() >= ndim (new leading axes), as PyTorch's
    Tensor repeat(const std::vector<int64_t>& repeats, Loc loc = Loc::here()) const;
    // pieces along an axis: chunk(n) of ceil(size / n) each (the last smaller, maybe fewer
    // than n); split(size) of size each (the last smaller); split(sizes) of the sizes given
    std::vector<Tensor> chunk(int64_t chunks, int axis = 0, Loc loc = Loc::here()) const;
    std::vector<Tensor> split(int64_t size, int axis = 0, Loc loc = Loc::here()) const;
    std::vector<Tensor> split(const std::vector<int64_t>& sizes, int axis = 0,
                              Loc loc = Loc::here()) const;
    Tensor clone(Loc loc = Loc::here()) const;        // a copy in its own buffer; grads flow

    // composed
    Tensor matmul(const Tensor& other, Loc loc = Loc::here()) const;    // like torch.matmul
    Tensor mm(const Tensor& other, Loc loc = Loc::here()) const;        // [n,k] @ [k,m] only
    Tensor bmm(const Tensor& other, Loc loc = Loc::here()) const;       // [b,n,k] @ [b,k,m]
    Tensor softmax(int axis = -1, Loc loc = Loc::here()) const;
    Tensor log_softmax(int axis = -1, Loc loc = Loc::here()) const;
    Tensor gather(int axis, const Tensor& index, Loc loc = Loc::here()) const;  // torch.gather
    Tensor index_select(int axis, const Tensor& index, Loc loc = Loc::here()) const;
    // The coordinates of the nonzero elements (NaN among them), [n, dim()] int64 in row-major
    // order, as torch.nonzero (argwhere); and the elements where mask (bool, broadcast with
    // this) is true, flattened, as torch.masked_select (its gradient goes back to them). Their
    // shapes depend on values: each runs what it reads first, as PyTorch's syncs.
    Tensor nonzero(Loc loc = Loc::here()) const;
    Tensor argwhere(Loc loc = Loc::here()) const { return nonzero(loc); }
    // The distinct values, sorted (each NaN its own, last), with each element's index among
    // them and their counts, as torch.unique(x, return_inverse=True, return_counts=True):
    // auto [values, inverse, counts] = x.unique(). It reads x (and gives no gradient).
    Unique unique(Loc loc = Loc::here()) const;
    Tensor masked_select(const Tensor& mask, Loc loc = Loc::here()) const;
    // gather's adjoint, as torch.scatter_add: this with src[i][j] added at [index[i][j]][j]
    // (axis 0). index has this's rank and is no longer than src along any axis, nor than this
    // along the others; repeated indices add up, in index order (the same bits every run)
    Tensor scatter_add(int axis, const Tensor& index, const Tensor& src,
                       Loc loc = Loc::here()) const;
    // as torch.index_add: source's slice i along the axis, times alpha, added at slice
    // index[i] of this (index 1-D, one per slice of source)
    Tensor index_add(int axis, const Tensor& index, const Tensor& source, Scalar alpha = 1,
                     Loc loc = Loc::here()) const;
    // as torch.scatter: this with src[i][j] written at [index[i][j]][j] (axis 0), index and src
    // as scatter_add's; of several writes to one place the last in index order stays (PyTorch
    // leaves it unspecified). With a value: the value written at each place index names.
    Tensor scatter(int axis, const Tensor& index, const Tensor& src, Loc loc = Loc::here()) const;
    Tensor scatter(int axis, const Tensor& index, Scalar value, Loc loc = Loc::here()) const;
    // as torch.scatter_reduce: src combined into this at index by reduce, "sum", "mean" (for
    // integers rounded down), "amax", "amin" (the gradient shared by the ties, this's among
    // them) or "prod"; include_self = false: this's element is left out where src reaches it.
    // "prod" compares every index along the axis with every place of it (work index's size
    // along the axis times this's): meant for short axes; the others run as scatters.
    Tensor scatter_reduce(int axis, const Tensor& index, const Tensor& src,
                          const std::string& reduce, bool include_self = true,
                          Loc loc = Loc::here()) const;
    // index_copy, index_fill, index_reduce: as torch's, through scatter with index (1-D, one
    // per slice of source along the axis) spread over the slices, as index_add
    Tensor index_copy(int axis, const Tensor& index, const Tensor& source,
                      Loc loc = Loc::here()) const;
    Tensor index_fill(int axis, const Tensor& index, Scalar value, Loc loc = Loc::here()) const;
    Tensor index_reduce(int axis, const Tensor& index, const Tensor& source,
                        const std::string& reduce, bool include_self = true,
                        Loc loc = Loc::here()) const;
    // rows: C[X], X [B,T] → [B,T,E]; a negative index counts from the end, as in PyTorch
    Tensor operator[](Operand index) const;
    Tensor operator[](Index i) const;                  // x[i]: drops the first axis

    // autograd
    // a leaf: backward() fills its grad()
    Tensor& requires_grad(bool on = true, Loc loc = Loc::here());
    bool tracks_grad() const;                          // requires grad, itself or through inputs
    void backward(const Tensor& seed = Tensor(), Loc loc = Loc::here()) const;  // scalars: seed 1
    Tensor grad() const;                               // undefined until a backward reaches it
    void zero_grad();                                  // forgets the gradient
    Tensor detach() const;                             // same values, no gradient history

    // writing into existing storage: the optimizers' in-place update. Lazy: the write happens
    // when the returned tensor is realized, so dropping it drops the write (a warning)
    [[nodiscard]] Tensor assign(const Tensor& value, Loc loc = Loc::here()) const;

    // running it
    Tensor& realize(Loc loc = Loc::here());            // compute now; keeps the result
    Tensor to(const std::string& device, Loc loc = Loc::here()) const;  // a copy there
    double item(Loc loc = Loc::here()) const;                // the one value of a 1-element tensor
    template <typename T = float> std::vector<T> to_vector(Loc loc = Loc::here()) const;
    std::string to_string() const;                     // as operator<< prints it

private:
    std::shared_ptr<detail::Node> node_;
};

// What x.max(axis), x.min(axis) and x.topk(k) give, as torch.return_types: .values and the
// int64 .indices; it is also the values tensor itself, so x.max(1, true) stands where a tensor
// is expected, and auto [values, indices] = x.max(1) unpacks it. As in PyTorch, the gradient
// of these values goes to the elements at the indices (the first of tied ones), while that of
// max and min over all elements or a list of axes (PyTorch's amax, amin) goes to every tie
// evenly.
// What x.unique() gives: values [n] in x's dtype; inverse, x's shape, and counts [n], int64
struct Unique {
    Tensor values, inverse, counts;
};
struct ValuesIndices : Tensor {
    Tensor values, indices;
    ValuesIndices(const Tensor& v, const Tensor& i) : Tensor(v), values(v), indices(i) {}
    template <size_t I> Tensor& get() { return I == 0 ? values : indices; }
    template <size_t I> const Tensor& get() const { return I == 0 ? values : indices; }
};

namespace detail {
// loc: where an undefined tensor's error points (by default, the caller of the library)
std::vector<double> tensor_values(const Tensor& t, Loc loc = {});   // NaN canonical
// exact; floats truncated, saturating
std::vector<int64_t> tensor_ints(const Tensor& t, Loc loc = {});
}  // namespace detail
template <typename T> std::vector<T> Tensor::to_vector(Loc loc) const {
    if constexpr (std::is_integral_v<T>) {
        std::vector<int64_t> values = detail::tensor_ints(*this, loc);
        return std::vector<T>(values.begin(), values.end());
    } else {
        std::vector<double> values = detail::tensor_values(*this, loc);
        return std::vector<T>(values.begin(), values.end());
    }
}

Tensor operator-(Operand x);
Tensor operator+(Operand a, const Tensor& b);
Tensor operator-(Operand a, const Tensor& b);
Tensor operator*(Operand a, const Tensor& b);
Tensor operator/(Operand a, const Tensor& b);   // true division: ints give float32
Tensor operator%(Operand a, const Tensor& b);   // remainder with the divisor's sign, as Python
Tensor operator<(Operand a, const Tensor& b);   // comparisons give bool
Tensor operator<=(Operand a, const Tensor& b);
Tensor operator>(Operand a, const Tensor& b);
Tensor operator>=(Operand a, const Tensor& b);
Tensor operator==(Operand a, Operand b);        // both operands converted: C++20 also tries
Tensor operator!=(Operand a, Operand b);        // b == a, which must not be a better match
#define TG_SCALAR_OPERATORS(op)                                                                \
    Tensor operator op(Operand a, Scalar b);                                                   \
    Tensor operator op(Scalar a, Operand b);
TG_SCALAR_OPERATORS(+) TG_SCALAR_OPERATORS(-) TG_SCALAR_OPERATORS(*) TG_SCALAR_OPERATORS(/)
TG_SCALAR_OPERATORS(%)
TG_SCALAR_OPERATORS(<) TG_SCALAR_OPERATORS(<=) TG_SCALAR_OPERATORS(>) TG_SCALAR_OPERATORS(>=)
TG_SCALAR_OPERATORS(==) TG_SCALAR_OPERATORS(!=)
#undef TG_SCALAR_OPERATORS
std::ostream& operator<<(std::ostream& os, const Tensor& t);

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc = Loc::here());
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc = Loc::here());
// bool, elementwise and broadcast: nonzero (NaN too) is true
Tensor logical_and(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor logical_or(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor logical_xor(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor cat(const std::vector<Tensor>& tensors, int axis = 0, Loc loc = Loc::here());
Tensor stack(const std::vector<Tensor>& tensors, int axis = 0, Loc loc = Loc::here());
// "ij,jk->ik", implicit output ("ij,jk"), "..." for broadcast batch axes, "ii->i" diagonals
Tensor einsum(const std::string& spec, const std::vector<Tensor>& operands, Loc loc = Loc::here());
// The p-norm distance of each row of x1 [..., P, M] to each row of x2 [..., R, M] (the leading
// axes broadcast): [..., P, R], as torch.cdist, from the differences themselves (PyTorch
// computes p = 2 through a product for more than 25 rows, rounding otherwise); the gradient at
// a distance of 0 is 0, and with p = INFINITY each tie for the largest gets it whole, as
// PyTorch's
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2, Loc loc = Loc::here());
// More of torch's functions, composed. diagonal: the diagonal offset above the main one (below,
// negative) of the axes axis1 and axis2, as a last axis (a strided view of x); trace: the sum of
// a matrix's diagonal; diag: a vector's square matrix (the vector on the diagonal offset), or
// a matrix's diagonal
Tensor diagonal(const Tensor& x, int64_t offset = 0, int axis1 = 0, int axis2 = 1,
                Loc loc = Loc::here());
Tensor trace(const Tensor& x, Loc loc = Loc::here());
Tensor diag(const Tensor& x, int64_t offset = 0, Loc loc = Loc::here());
// outer: a_i·b_j; kron: the Kronecker product (a's blocks scaled copies of b, the ranks padded
// with leading 1s)
Tensor outer(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor kron(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
// The n-th forward difference along the axis: x[i + 1] - x[i], n times
Tensor diff(const Tensor& x, int64_t n = 1, int axis = -1, Loc loc = Loc::here());
// ln(e^a + e^b) without overflow: max(a, b) + ln(1 + e^-|a - b|) (equal infinities kept)
Tensor logaddexp(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
// searchsorted: for each value, how many of the sorted sequence's last axis lie below it
// (right: at or below), sorted [..., n] against values [..., m] of the same leading axes (or
// sorted 1-D); bucketize: the same with boundaries 1-D, right as PyTorch's. int64.
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right = false,
                    Loc loc = Loc::here());
Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool right = false,
                 Loc loc = Loc::here());
// quantile: the q-th quantiles (each q in [0, 1]) along the axis (none: of all elements), as
// torch.quantile: rank q·(n - 1) of the sorted row, between its neighbours by interpolation
// "linear", "lower", "higher", "midpoint" or "nearest" (half to even); NaN in the row gives
// NaN. A list of q adds a first axis, one per q; one q (a double) does not.
Tensor quantile(const Tensor& x, double q, std::optional<int> axis = std::nullopt,
                bool keepdim = false, const std::string& interpolation = "linear",
                Loc loc = Loc::here());
Tensor quantile(const Tensor& x, const std::vector<double>& q,
                std::optional<int> axis = std::nullopt, bool keepdim = false,
                const std::string& interpolation = "linear", Loc loc = Loc::here());
// tensordot: a's last dims axes summed against b's first dims (or the axes listed, in pairs),
// the remaining axes a's then b's, as torch.tensordot: one matrix product
Tensor tensordot(const Tensor& a, const Tensor& b, int dims = 2, Loc loc = Loc::here());
Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int>& axes_a,
                 const std::vector<int>& axes_b, Loc loc = Loc::here());
// The grids of 1-D (or 0-d) tensors: each spread over the shape of all their lengths, as
// torch.meshgrid; indexing "ij" (the default) or "xy" (the first two axes swapped). Views.
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors,
                             const std::string& indexing = "ij", Loc loc = Loc::here());
// The cross product of 3-vectors along the axis (broadcast), as torch.linalg.cross
Tensor cross(const Tensor& a, const Tensor& b, int axis = -1, Loc loc = Loc::here());
// hypot: √(a² + b²) without overflow or underflow (the larger times √(1 + r²)); copysign: |a|
// with b's sign bit (-0 and NaN's too), its gradient ±1 where a is not 0; sinc: sin(πx)/(πx),
// 1 at 0
Tensor hypot(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor copysign(const Tensor& a, const Tensor& b, Loc loc = Loc::here());
Tensor sinc(const Tensor& x, Loc loc = Loc::here());
// bincount: how often each value 0, 1, ... of x (1-D, integer, not negative) occurs, at least
// minlength of them, as torch.bincount; with weights (x's shape) their sums instead (float32
// weights sum in float32, others in float64), with their gradient. Its length depends on
// x's values: x runs first, as nonzero's.
Tensor bincount(const Tensor& x, const Tensor& weights = Tensor(), int64_t minlength = 0,
                Loc loc = Loc::here());
// histc: the counts of x's elements in bins equal parts of [min, max] (the last part closed),
// in x's dtype, as torch.histc; outside it and NaN are not counted. min == max: x's own least
// and largest but NaN (those ± 1 if equal). No gradient.
Tensor histc(const Tensor& x, int64_t bins = 100, double min = 0, double max = 0,
             Loc loc = Loc::here());
// The [2, n] int64 row and column indices of a rows × cols matrix's lower (upper) triangle,
// offset as tril's, in row-major order, as torch.tril_indices
Tensor tril_indices(int64_t rows, int64_t cols, int64_t offset = 0, Loc loc = Loc::here());
Tensor triu_indices(int64_t rows, int64_t cols, int64_t offset = 0, Loc loc = Loc::here());
// x turned k quarter turns from the first axis towards the second (torch.rot90): views
Tensor rot90(const Tensor& x, int64_t k = 1, int axis0 = 0, int axis1 = 1, Loc loc = Loc::here());
// block_diag: the matrices (0-2 axes each) along the diagonal of one matrix, 0 elsewhere;
// cartesian_prod: every combination of the 1-D tensors' elements as rows, the last fastest
Tensor block_diag(const std::vector<Tensor>& tensors, Loc loc = Loc::here());
Tensor cartesian_prod(const std::vector<Tensor>& tensors, Loc loc = Loc::here());
// several results in one program
void realize(const std::vector<Tensor>& tensors, Loc loc = Loc::here());
void manual_seed(uint64_t seed);
uint64_t rng_state();   // where the seed stream is: manual_seed(rng_state()) later resumes it

// d output / d inputs as lazy tensors that can be differentiated again (a Hessian-vector
// product is gradients(sum(gradients(f, {x})[0] * v), {x})); backward() accumulates instead.
std::vector<Tensor> gradients(const Tensor& output, const std::vector<Tensor>& inputs,
                              const Tensor& seed = Tensor(), Loc loc = Loc::here());
struct NoGrad {                                      // tensors built in this scope track no grad
    NoGrad();
    ~NoGrad();
    NoGrad(const NoGrad&) = delete;
    NoGrad& operator=(const NoGrad&) = delete;
};

// A compiled training step. The first call runs step(inputs) while recording every realize
// (backward, the optimizer's updates, the returned tensor) into one program with one compile.
// Later calls with inputs of the same shapes run that program on the new inputs: no graph is
// built and nothing is compiled. step must not read values (item, to_vector) while tracing.
class Jit {
public:
    using Step = std::function<Tensor(const std::vector<Tensor>&)>;
    explicit Jit(Step step);
    Tensor operator()(const std::vector<Tensor>& inputs, Loc loc = Loc::here());
    int64_t replays() const;                         // calls that ran the compiled program
private:
    struct State;
    std::shared_ptr<State> state_;
};
inline Jit jit(Jit::Step step) { return Jit(std::move(step)); }

// ---- [INSPECT] every stage as text, for teaching and debugging ------------------------ >>inspect
struct Stages {
    std::string graph;          // the primitive ops, one per line, with shapes and dtypes
    std::string schedule;       // the kernels and the buffers they store
    std::string loop_ir;        // before the passes
    std::string optimized_ir;   // after the passes (the CPU's, or those TG_PASSES names)
    std::string c_source;       // what the CPU device compiles
};
Stages inspect(const std::vector<Tensor>& tensors, Loc loc = Loc::here());   // builds, runs nothing

struct Stats {                  // process-wide counters since start
    int64_t programs_run = 0, compiles = 0, disk_cache_hits = 0, memory_cache_hits = 0;
    double compile_seconds = 0, run_seconds = 0;
    int64_t background_compiles = 0;      // optimized builds of quick-built programs
    double background_compile_seconds = 0;
    // programs_run that ran in the background: optimizer steps (TG_SYNC) and parameters'
    // initializers that needed a compile
    int64_t background_runs = 0;
    // programs_run that a device ran as one recorded graph of its kernels (CUDA graphs)
    int64_t graph_runs = 0;
};
Stats stats();
// Waits until the optimized builds of quick-built programs, made in the background, are
// ready (a benchmark calls it before it times; nothing else needs to)
void finish_compiles();
// Waits until the programs running in the background (an optimizer's step, see TG_SYNC) are
// done, and throws the error of one that failed
void synchronize();

struct ProgramInfo {            // the most recent program run (this thread), for benchmarks
    std::string name;
    int nests_lowered = 0, nests = 0;          // loop nests before and after the passes
    int temporaries_lowered = 0, temporaries = 0;
    int local_arrays = 0;                      // temporaries that became arrays of one nest
    int tiled_nests = 0;                       // nests computed as tiled matrix products
    int64_t temp_bytes_lowered = 0;            // bytes of the temporaries lowering made,
    int64_t temp_bytes = 0, arena_bytes = 0;   // of those left after the passes, and planned
};
ProgramInfo last_program();
int threads();                  // what parallel nests run on: TG_THREADS, default the cores

// ---- [NN] layers, initialisers, losses ----------------------------------------------------- >>nn
namespace nn {
// A layer. named_parameters() lists its tensors with PyTorch's dotted names ("0.weight" in a
// Sequential, "blocks.1.attn.qkv.weight" in a model of your own) and parameters() the same
// tensors, the ones an optimizer updates; both are complete after the first call for layers
// that learn their input width then (nn::Linear(out)). A layer made of layers names them in
// children(): its parameters, train()/eval(), state_dict() and reseeding then reach them.
// Random initial values come from the global seed stream (manual_seed): seeds lists the ones a
// layer drew, and reset_parameters(seeds) draws its parameters again from the given ones (by
// default: each child, in order, takes as many as it holds; a count other than the layer's is
// an error that changes nothing). A layer of your own that draws random tensors itself records
// their seeds and overrides reset_parameters (check_seed_count first), and one made of layers
// calls take_seeds_of_children() in its constructor, so that Sequential can hand out seeds in
// layer order. Constructors that check their arguments take the caller's Loc last, as every
// API call does, and pass it to the layers they hold: their errors name the user's line.
struct Module {
    using Named = std::vector<std::pair<std::string, Tensor>>;
    virtual ~Module() = default;
    virtual Tensor forward(const Tensor& x) = 0;
    virtual std::vector<std::pair<std::string, Module*>> children() { return {}; }
    virtual Named named_parameters();                 // the children's, "child.name"
    virtual std::vector<Tensor> parameters();         // the tensors of named_parameters()
    // tensors a layer keeps that no optimizer updates (BatchNorm's running statistics)
    virtual Named named_buffers();                    // the children's, "child.name"
    virtual void reset_parameters(const std::vector<uint64_t>& new_seeds);
    Tensor operator()(const Tensor& x, Loc loc = Loc::here());
    void zero_grad();   // forgets every parameter's gradient (PyTorch's set_to_none)
    // training (the default) or evaluating, with every child: Dropout acts only while training
    virtual void train(bool on = true);
    void eval() { train(false); }
    // the parameters and buffers by name; tg::safetensors::save(path, m.state_dict()) writes a
    // file that PyTorch's load_state_dict reads for a model of the same structure, and back
    std::map<std::string, Tensor> state_dict();
    // copies each tensor into the parameter of its name (cast to its dtype, moved to its
    // device), all in one program. Checked first: a shape that differs, or with strict a name
    // missing or unknown, is an error that changes nothing
    void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true,
                         Loc loc = Loc::here());
    // moves every parameter and buffer to device ("CUDA", "CPU:1", ...) in place, as PyTorch's
    // module.to: the tensors keep their identity, their values (and gradients) are copied
    // there. Make the optimizer after it (its state lives where the parameters were); a graph
    // built before that reads them, and a tg::Jit traced before, are refused afterwards.
    Module& to(const std::string& device, Loc loc = Loc::here());
    std::vector<uint64_t> seeds;
    bool training = true;
protected:
    void take_seeds_of_children();   // seeds = the children's, in order (for a constructor)
    // an error unless new_seeds holds `wanted` (what `layer` draws), before anything changes
    static void check_seed_count(const std::vector<uint64_t>& new_seeds, size_t wanted,
                                 const char* layer);
};

struct Linear : Module {                    // y = x Wᵀ + b, W [out, in]; PyTorch's init
    Linear(int64_t in_features, int64_t out_features, bool bias = true, Loc loc = Loc::here());
    // learns in_features from its first input
    explicit Linear(int64_t out_features, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    int64_t in_features = -1, out_features;
    bool has_bias = true;
    Tensor weight, bias;
};
// y = x1ᵀ A_o x2 + b_o for each output o: weight [out, in1, in2] and bias [out], both
// U(-1/√in1, 1/√in1) to start, as PyTorch's. Two inputs: call it as bilinear(x1, x2).
struct Bilinear : Module {
    Bilinear(int64_t in1_features, int64_t in2_features, int64_t out_features, bool bias = true,
             Loc loc = Loc::here());
    Tensor operator()(const Tensor& x1, const Tensor& x2, Loc loc = Loc::here());
    using Module::operator();   // of one input: forward's error
    Tensor forward(const Tensor& x) override;   // an error: it takes two inputs
    Named named_parameters() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    int64_t in1_features, in2_features, out_features;
    bool has_bias;
    Tensor weight, bias;
};
// Rows of weight [num, dim] (N(0, 1) to start) picked by int ids. The row padding_idx (negative:
// from the end) starts as zeros and gets no gradient, as PyTorch's: a padding id's vector stays.
struct Embedding : Module {
    Embedding(int64_t num_embeddings, int64_t embedding_dim,
              std::optional<int64_t> padding_idx = std::nullopt, Loc loc = Loc::here());
    Tensor forward(const Tensor& ids) override;
    Named named_parameters() override { return {{"weight", weight}}; }
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    std::optional<int64_t> padding_idx;   // in [0, num_embeddings)
    Tensor weight;
};
// Bags of rows of weight [num, dim] (N(0, 1) to start; the row padding_idx zeros), reduced by
// mode "mean", "sum" or "max" (functional::embedding_bag): forward(ids) takes bags of one
// length, ids [bags, length]; call it as bag(ids, offsets, per_sample_weights) for ids [n]
// cut into bags at offsets.
struct EmbeddingBag : Module {
    EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, const std::string& mode = "mean",
                 bool include_last_offset = false,
                 std::optional<int64_t> padding_idx = std::nullopt, Loc loc = Loc::here());
    Tensor forward(const Tensor& ids) override;
    Tensor operator()(const Tensor& ids, const Tensor& offsets,
                      const Tensor& per_sample_weights = Tensor(), Loc loc = Loc::here());
    using Module::operator();
    Named named_parameters() override { return {{"weight", weight}}; }
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    std::string mode;
    bool include_last_offset;
    std::optional<int64_t> padding_idx;   // in [0, num_embeddings)
    Tensor weight;
};
// Over the last axes, normalized_shape: (x - mean)/√(var + eps), then · weight + bias (ones and
// zeros to start, normalized_shape each) where elementwise_affine (and bias) hold
struct LayerNorm : Module {
    explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true,
                       bool bias = true, Loc loc = Loc::here());
    explicit LayerNorm(const Shape& normalized_shape, double eps = 1e-5,
                       bool elementwise_affine = true, bool bias = true, Loc loc = Loc::here());
    // LayerNorm({3, 4}) (a braced list alone would also fit the copy constructor)
    explicit LayerNorm(std::initializer_list<int64_t> normalized_shape, double eps = 1e-5,
                       bool elementwise_affine = true, bool bias = true, Loc loc = Loc::here())
        : LayerNorm(Shape(normalized_shape), eps, elementwise_affine, bias, loc) {}
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    Shape normalized_shape;
    double eps;
    Tensor weight, bias;   // undefined where not learned
};
// Over the last axes, normalized_shape: x/√(mean(x²) + eps), then · weight (ones to start,
// normalized_shape) where elementwise_affine, as PyTorch's RMSNorm; eps std::nullopt: the
// spacing of x's floats at 1 (2⁻²³ for float32, 2⁻⁵² for float64)
struct RMSNorm : Module {
    explicit RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt,
                     bool elementwise_affine = true, Loc loc = Loc::here());
    explicit RMSNorm(const Shape& normalized_shape, std::optional<double> eps = std::nullopt,
                     bool elementwise_affine = true, Loc loc = Loc::here());
    explicit RMSNorm(std::initializer_list<int64_t> normalized_shape,
                     std::optional<double> eps = std::nullopt, bool elementwise_affine = true,
                     Loc loc = Loc::here())
        : RMSNorm(Shape(normalized_shape), eps, elementwise_affine, loc) {}
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    Shape normalized_shape;
    std::optional<double> eps;
    Tensor weight;   // undefined where not learned
};
// x [N, C, *] in num_groups groups of C / num_groups channels, each normalized over its
// channels and positions, then · weight + bias per channel (affine: ones and zeros to start)
struct GroupNorm : Module {
    GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true,
              Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    int64_t num_groups, num_channels;
    double eps;
    Tensor weight, bias;
};
// Each channel of x [N, C, *spatial] normalized, then · weight + bias per channel (affine).
// While training: by its mean and biased variance over the batch and positions, and the
// running mean and unbiased variance move toward those, r = (1 - momentum)·r + momentum·batch's
// (updated in forward, with x computed in the same program; in a jitted step, in its program);
// momentum std::nullopt: the mean of every batch so far (momentum 1 / batches), as PyTorch's
// None. In eval(): by the running statistics. Buffers: running_mean, running_var and
// num_batches_tracked, as PyTorch's state_dict names them. track_running_stats false: no
// buffers, and the batch's statistics in eval() too.
struct BatchNormNd : Module {
    BatchNormNd(int spatial_axes, int64_t num_features, double eps,
                std::optional<double> momentum, bool affine, bool track_running_stats,
                Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    Named named_buffers() override;
    int spatial_axes;   // BatchNorm1d takes [N, C] too
    int64_t num_features;
    double eps;
    std::optional<double> momentum;
    Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
template <int SpatialAxes> struct BatchNorm : BatchNormNd {
    explicit BatchNorm(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true, Loc loc = Loc::here())
        : BatchNormNd(SpatialAxes, num_features, eps, momentum, affine, track_running_stats,
                      loc) {}
};
using BatchNorm1d = BatchNorm<1>;
using BatchNorm2d = BatchNorm<2>;
using BatchNorm3d = BatchNorm<3>;
// Each channel of each sample of x [N, C, *spatial] (or [C, *spatial]) normalized over its
// positions, then · weight + bias per channel where affine (ones and zeros to start; off by
// default, as PyTorch's). track_running_stats: while training, running_mean and running_var
// move toward the samples' mean statistics (the variance unbiased), r = (1 - momentum)·r +
// momentum·theirs, and eval() normalizes by them. num_batches_tracked is kept for PyTorch's
// state_dict names; as PyTorch's, it does not count.
struct InstanceNormNd : Module {
    InstanceNormNd(int spatial_axes, int64_t num_features, double eps, double momentum,
                   bool affine, bool track_running_stats, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    Named named_buffers() override;
    int spatial_axes;
    int64_t num_features;
    double eps, momentum;
    Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
template <int SpatialAxes> struct InstanceNorm : InstanceNormNd {
    explicit InstanceNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false,
                          Loc loc = Loc::here())
        : InstanceNormNd(SpatialAxes, num_features, eps, momentum, affine, track_running_stats,
                         loc) {}
};
using InstanceNorm1d = InstanceNorm<1>;
using InstanceNorm2d = InstanceNorm<2>;
using InstanceNorm3d = InstanceNorm<3>;
// Each element of x [N, C, *] divided by (k + α/size·Σ x²)^β, the sum over the size channels
// around it (size/2 before, (size - 1)/2 after; none past the ends), as PyTorch's
struct LocalResponseNorm : Module {
    explicit LocalResponseNorm(int64_t size, double alpha = 1e-4, double beta = 0.75,
                               double k = 1, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    int64_t size;
    double alpha, beta, k;
};
struct Lambda : Module {                    // any function as a layer
    explicit Lambda(std::function<Tensor(const Tensor&)> f) : fn(std::move(f)) {}
    Tensor forward(const Tensor& x) override { return fn(x); }
    std::function<Tensor(const Tensor&)> fn;
};
struct Identity : Module { Tensor forward(const Tensor& x) override { return x; } };
// While training, each element is zeroed with probability p and the others scaled by 1/(1-p);
// in eval() x passes as it is. Every call draws a new mask, in a jitted step too: the count of
// masks drawn is a tensor that the step's program reads and counts on.
struct Dropout : Module {
    explicit Dropout(double p = 0.5, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    double p;
    Tensor draws;   // int64, made on the first call, on the input's device

protected:
    // x with a mask drawn while training: of x's shape, or with spatial_axes > 0, one draw per
    // channel of x [N, C, *spatial] or [C, *spatial]
    Tensor dropped(const Tensor& x, int spatial_axes);
};
// Dropout1d, Dropout2d, Dropout3d: each channel of x [N, C, *spatial] (or [C, *spatial]; 1, 2
// or 3 spatial axes) zeroed whole with probability p while training, the others scaled
template <int SpatialAxes> struct DropoutNd : Dropout {
    explicit DropoutNd(double p = 0.5, Loc loc = Loc::here()) : Dropout(p, loc) {}
    Tensor forward(const Tensor& x) override { return dropped(x, SpatialAxes); }
};
using Dropout1d = DropoutNd<1>;
using Dropout2d = DropoutNd<2>;
using Dropout3d = DropoutNd<3>;
struct ReLU : Module { Tensor forward(const Tensor& x) override { return x.relu(); } };
struct Tanh : Module { Tensor forward(const Tensor& x) override { return x.tanh(); } };
struct Sigmoid : Module { Tensor forward(const Tensor& x) override { return x.sigmoid(); } };
struct GELU : Module {
    explicit GELU(bool tanh_approximation = false) : tanh_approximation(tanh_approximation) {}
    Tensor forward(const Tensor& x) override { return x.gelu(tanh_approximation); }
    bool tanh_approximation;
};
struct SiLU : Module { Tensor forward(const Tensor& x) override { return x.silu(); } };
struct LeakyReLU : Module {
    explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
    Tensor forward(const Tensor& x) override { return x.leaky_relu(negative_slope); }
    double negative_slope;
};
struct ELU : Module {
    explicit ELU(double alpha = 1) : alpha(alpha) {}
    Tensor forward(const Tensor& x) override { return x.elu(alpha); }
    double alpha;
};
struct Softplus : Module {
    explicit Softplus(double beta = 1, double threshold = 20) : beta(beta), threshold(threshold) {}
    Tensor forward(const Tensor& x) override { return x.softplus(beta, threshold); }
    double beta, threshold;
};
// functional's other activations as layers (declared after it, below): Hardtanh, ReLU6,
// Hardsigmoid, Hardswish, Mish, SELU, CELU, Softsign, LogSigmoid, Tanhshrink, Hardshrink,
// Softshrink, Threshold, PReLU (a learned weight, 0.25 to start); Softmax and LogSoftmax
struct Hardtanh : Module {
    explicit Hardtanh(double min_val = -1, double max_val = 1, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    double min_val, max_val;
};
struct ReLU6 : Module { Tensor forward(const Tensor& x) override; };
struct Hardsigmoid : Module { Tensor forward(const Tensor& x) override; };
struct Hardswish : Module { Tensor forward(const Tensor& x) override; };
struct Mish : Module { Tensor forward(const Tensor& x) override; };
struct SELU : Module { Tensor forward(const Tensor& x) override; };
struct CELU : Module {
    explicit CELU(double alpha = 1) : alpha(alpha) {}
    Tensor forward(const Tensor& x) override;
    double alpha;
};
struct Softsign : Module { Tensor forward(const Tensor& x) override; };
struct LogSigmoid : Module { Tensor forward(const Tensor& x) override; };
struct Tanhshrink : Module { Tensor forward(const Tensor& x) override; };
struct Hardshrink : Module {
    explicit Hardshrink(double lambd = 0.5) : lambd(lambd) {}
    Tensor forward(const Tensor& x) override;
    double lambd;
};
struct Softshrink : Module {
    explicit Softshrink(double lambd = 0.5, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    double lambd;
};
struct Threshold : Module {
    Threshold(double threshold, double value) : threshold(threshold), value(value) {}
    Tensor forward(const Tensor& x) override;
    double threshold, value;
};
struct PReLU : Module {
    explicit PReLU(int64_t num_parameters = 1, double init = 0.25, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override { return {{"weight", weight}}; }
    Tensor weight;
};
struct GLU : Module {   // the first half of x along dim, times σ(the second half)
    explicit GLU(int dim = -1) : dim(dim) {}
    Tensor forward(const Tensor& x) override;
    int dim;
};
struct Softmin : Module {   // softmax(-x)
    explicit Softmin(int dim = -1) : dim(dim) {}
    Tensor forward(const Tensor& x) override;
    int dim;
};
// functional::pairwise_distance and cosine_similarity as layers of two inputs
struct PairwiseDistance : Module {
    explicit PairwiseDistance(double p = 2, double eps = 1e-6, bool keepdim = false)
        : p(p), eps(eps), keepdim(keepdim) {}
    Tensor operator()(const Tensor& x1, const Tensor& x2, Loc loc = Loc::here());
    using Module::operator();   // of one input: forward's error
    Tensor forward(const Tensor& x) override;   // an error: it takes two inputs
    double p, eps;
    bool keepdim;
};
struct CosineSimilarity : Module {
    explicit CosineSimilarity(int dim = 1, double eps = 1e-8) : dim(dim), eps(eps) {}
    Tensor operator()(const Tensor& x1, const Tensor& x2, Loc loc = Loc::here());
    using Module::operator();   // of one input: forward's error
    Tensor forward(const Tensor& x) override;   // an error: it takes two inputs
    int dim;
    double eps;
};
struct Softmax : Module {
    explicit Softmax(int dim = -1) : dim(dim) {}
    Tensor forward(const Tensor& x) override { return x.softmax(dim); }
    int dim;
};
struct LogSoftmax : Module {
    explicit LogSoftmax(int dim = -1) : dim(dim) {}
    Tensor forward(const Tensor& x) override { return x.log_softmax(dim); }
    int dim;
};
struct Flatten : Module {                   // axes start..end as one, as x.flatten
    explicit Flatten(int start_axis = 1, int end_axis = -1) : start(start_axis), end(end_axis) {}
    Tensor forward(const Tensor& x) override { return x.flatten(start, end); }
    int start, end;
};
struct Unflatten : Module {                 // the axis split into sizes, as x.unflatten
    Unflatten(int axis, Shape sizes) : axis(axis), sizes(std::move(sizes)) {}
    Tensor forward(const Tensor& x) override { return x.unflatten(axis, sizes); }
    int axis;
    Shape sizes;
};

// A convolution's or pooling's kernel, stride, padding or dilation along the spatial axes, as
// PyTorch takes them: one size for every axis (3), or one per axis ({3, 5}).
struct SpatialSizes {
    SpatialSizes() = default;   // a pooling's stride: its kernel's
    SpatialSizes(int64_t every) : sizes{every} {}
    SpatialSizes(std::initializer_list<int64_t> each) : sizes(each) {}
    // not from a floating-point number: interpolate(x, 2.5) would take it for a size of 2
    // (a scale is scale_factor(2.5))
    template <typename F, std::enable_if_t<std::is_floating_point_v<F>, int> = 0>
    SpatialSizes(F) = delete;
    std::vector<int64_t> sizes;
};
// interpolate's scale_factor, in place of a size: scale_factor(2) for every spatial axis, or
// scale_factor({2, 1.5}) one per axis. Made by a function, so that braces ({8, 10}) stay a size.
struct ScaleFactor {
    std::vector<double> factors;
};
inline ScaleFactor scale_factor(double every) { return {{every}}; }
inline ScaleFactor scale_factor(std::initializer_list<double> each) { return {each}; }
// A convolution's padding: sizes, or "valid" (none) or "same" (stride 1 only: dilation·(kernel
// - 1) in all along each axis, half before, the odd one after, so the output is as large)
struct ConvPadding : SpatialSizes {
    template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
    ConvPadding(I every) : SpatialSizes(int64_t(every)) {}
    ConvPadding(std::initializer_list<int64_t> each) : SpatialSizes(each) {}
    ConvPadding(const SpatialSizes& sizes) : SpatialSizes(sizes) {}
    ConvPadding(const char* rule) : rule(rule) {}
    std::string rule;   // "" (the sizes), "valid" or "same"
};
// functional::conv1d/2d/3d (Conv1d/2d/3d) with weight [out, in / groups, *kernel] and bias
// [out]; transposed: conv_transpose1d/2d/3d (ConvTranspose1d/2d/3d) with weight [in, out /
// groups, *kernel]. PyTorch's init: U(-1/√fan_in,
// 1/√fan_in) for both, fan_in = the weight's size from axis 1 on (in / groups, or out / groups,
// times the kernel's size)
// padding_mode: "zeros", or F.pad's "reflect", "replicate" or "circular" (the input padded so,
// then convolved without padding); a transposed one takes sizes and zeros only.
struct ConvNd : Module {
    ConvNd(int spatial_axes, int64_t in_channels, int64_t out_channels, SpatialSizes kernel_size,
           SpatialSizes stride, ConvPadding padding, SpatialSizes dilation, int64_t groups,
           bool bias, bool transposed = false, SpatialSizes output_padding = 0,
           std::string padding_mode = "zeros", Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    int spatial_axes;
    int64_t in_channels, out_channels, groups;
    std::vector<int64_t> kernel_size, stride, padding, dilation, output_padding;
    std::string padding_rule, padding_mode;   // padding_rule: ConvPadding's rule
    bool has_bias, transposed;
    Tensor weight, bias;
};
template <int SpatialAxes> struct Conv : ConvNd {
    Conv(int64_t in_channels, int64_t out_channels, SpatialSizes kernel_size,
         SpatialSizes stride = 1, ConvPadding padding = 0, SpatialSizes dilation = 1,
         int64_t groups = 1, bool bias = true, std::string padding_mode = "zeros",
         Loc loc = Loc::here())
        : ConvNd(SpatialAxes, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, false, 0, std::move(padding_mode), loc) {}
};
using Conv1d = Conv<1>;
using Conv2d = Conv<2>;
using Conv3d = Conv<3>;
template <int SpatialAxes> struct ConvTranspose : ConvNd {   // PyTorch's order of arguments
    ConvTranspose(int64_t in_channels, int64_t out_channels, SpatialSizes kernel_size,
                  SpatialSizes stride = 1, SpatialSizes padding = 0,
                  SpatialSizes output_padding = 0, int64_t groups = 1, bool bias = true,
                  SpatialSizes dilation = 1, Loc loc = Loc::here())
        : ConvNd(SpatialAxes, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, true, output_padding, "zeros", loc) {}
};
using ConvTranspose1d = ConvTranspose<1>;
using ConvTranspose2d = ConvTranspose<2>;
using ConvTranspose3d = ConvTranspose<3>;
// functional's poolings as layers, over 1 to 3 spatial axes: max_pool, avg_pool,
// adaptive_avg_pool (AdaptiveAvgPool2d(1) before a classifier's head), adaptive_max_pool,
// lp_pool (1 and 2 axes, as PyTorch's)
struct MaxPoolNd : Module {
    MaxPoolNd(int spatial_axes, SpatialSizes kernel_size, SpatialSizes stride,
              SpatialSizes padding, SpatialSizes dilation, bool ceil_mode)
        : spatial_axes(spatial_axes), kernel_size(kernel_size), stride(stride), padding(padding),
          dilation(dilation), ceil_mode(ceil_mode) {}
    Tensor forward(const Tensor& x) override;
    int spatial_axes;
    SpatialSizes kernel_size, stride, padding, dilation;
    bool ceil_mode;
};
template <int SpatialAxes> struct MaxPool : MaxPoolNd {
    explicit MaxPool(SpatialSizes kernel_size, SpatialSizes stride = {}, SpatialSizes padding = 0,
                     SpatialSizes dilation = 1, bool ceil_mode = false)
        : MaxPoolNd(SpatialAxes, kernel_size, stride, padding, dilation, ceil_mode) {}
};
using MaxPool1d = MaxPool<1>;
using MaxPool2d = MaxPool<2>;
using MaxPool3d = MaxPool<3>;
// functional::max_unpool as a layer: unpool(x, indices) or unpool(x, indices, output_size)
struct MaxUnpoolNd : Module {
    MaxUnpoolNd(int spatial_axes, SpatialSizes kernel_size, SpatialSizes stride,
                SpatialSizes padding)
        : spatial_axes(spatial_axes), kernel_size(kernel_size), stride(stride), padding(padding) {}
    Tensor operator()(const Tensor& x, const Tensor& indices, SpatialSizes output_size = {},
                      Loc loc = Loc::here());
    using Module::operator();   // of one input: forward's error
    Tensor forward(const Tensor& x) override;   // an error: it takes the indices too
    int spatial_axes;
    SpatialSizes kernel_size, stride, padding;
};
template <int SpatialAxes> struct MaxUnpool : MaxUnpoolNd {
    explicit MaxUnpool(SpatialSizes kernel_size, SpatialSizes stride = {},
                       SpatialSizes padding = 0)
        : MaxUnpoolNd(SpatialAxes, kernel_size, stride, padding) {}
};
using MaxUnpool1d = MaxUnpool<1>;
using MaxUnpool2d = MaxUnpool<2>;
using MaxUnpool3d = MaxUnpool<3>;
struct AvgPoolNd : Module {
    AvgPoolNd(int spatial_axes, SpatialSizes kernel_size, SpatialSizes stride,
              SpatialSizes padding, bool count_include_pad, bool ceil_mode,
              std::optional<int64_t> divisor_override)
        : spatial_axes(spatial_axes), kernel_size(kernel_size), stride(stride), padding(padding),
          count_include_pad(count_include_pad), ceil_mode(ceil_mode),
          divisor_override(divisor_override) {}
    Tensor forward(const Tensor& x) override;
    int spatial_axes;
    SpatialSizes kernel_size, stride, padding;
    bool count_include_pad, ceil_mode;
    std::optional<int64_t> divisor_override;
};
template <int SpatialAxes> struct AvgPool : AvgPoolNd {   // functional::avg_pool's order
    explicit AvgPool(SpatialSizes kernel_size, SpatialSizes stride = {}, SpatialSizes padding = 0,
                     bool count_include_pad = true, bool ceil_mode = false,
                     std::optional<int64_t> divisor_override = std::nullopt)
        : AvgPoolNd(SpatialAxes, kernel_size, stride, padding, count_include_pad, ceil_mode,
                    divisor_override) {}
};
using AvgPool1d = AvgPool<1>;
using AvgPool2d = AvgPool<2>;
using AvgPool3d = AvgPool<3>;
struct AdaptivePoolNd : Module {   // the mean or the largest of each bin
    AdaptivePoolNd(int spatial_axes, SpatialSizes output_size, bool largest)
        : spatial_axes(spatial_axes), output_size(output_size), largest(largest) {}
    Tensor forward(const Tensor& x) override;
    int spatial_axes;
    SpatialSizes output_size;
    bool largest;
};
template <int SpatialAxes> struct AdaptiveAvgPool : AdaptivePoolNd {
    explicit AdaptiveAvgPool(SpatialSizes output_size)
        : AdaptivePoolNd(SpatialAxes, output_size, false) {}
};
using AdaptiveAvgPool1d = AdaptiveAvgPool<1>;
using AdaptiveAvgPool2d = AdaptiveAvgPool<2>;
using AdaptiveAvgPool3d = AdaptiveAvgPool<3>;
template <int SpatialAxes> struct AdaptiveMaxPool : AdaptivePoolNd {
    explicit AdaptiveMaxPool(SpatialSizes output_size)
        : AdaptivePoolNd(SpatialAxes, output_size, true) {}
};
using AdaptiveMaxPool1d = AdaptiveMaxPool<1>;
using AdaptiveMaxPool2d = AdaptiveMaxPool<2>;
using AdaptiveMaxPool3d = AdaptiveMaxPool<3>;
struct LPPoolNd : Module {
    LPPoolNd(int spatial_axes, double norm_type, SpatialSizes kernel_size, SpatialSizes stride,
             bool ceil_mode)
        : spatial_axes(spatial_axes), norm_type(norm_type), kernel_size(kernel_size),
          stride(stride), ceil_mode(ceil_mode) {}
    Tensor forward(const Tensor& x) override;
    int spatial_axes;
    double norm_type;
    SpatialSizes kernel_size, stride;
    bool ceil_mode;
};
template <int SpatialAxes> struct LPPool : LPPoolNd {
    LPPool(double norm_type, SpatialSizes kernel_size, SpatialSizes stride = {},
           bool ceil_mode = false)
        : LPPoolNd(SpatialAxes, norm_type, kernel_size, stride, ceil_mode) {}
};
using LPPool1d = LPPool<1>;
using LPPool2d = LPPool<2>;

// functional::pixel_shuffle, pixel_unshuffle, channel_shuffle, unfold and fold as layers
struct PixelShuffle : Module {
    explicit PixelShuffle(int64_t upscale_factor) : upscale_factor(upscale_factor) {}
    Tensor forward(const Tensor& x) override;
    int64_t upscale_factor;
};
struct PixelUnshuffle : Module {
    explicit PixelUnshuffle(int64_t downscale_factor) : downscale_factor(downscale_factor) {}
    Tensor forward(const Tensor& x) override;
    int64_t downscale_factor;
};
struct ChannelShuffle : Module {
    explicit ChannelShuffle(int64_t groups) : groups(groups) {}
    Tensor forward(const Tensor& x) override;
    int64_t groups;
};
struct Unfold : Module {
    explicit Unfold(SpatialSizes kernel_size, SpatialSizes dilation = 1, SpatialSizes padding = 0,
                    SpatialSizes stride = 1)
        : kernel_size(kernel_size), dilation(dilation), padding(padding), stride(stride) {}
    Tensor forward(const Tensor& x) override;
    SpatialSizes kernel_size, dilation, padding, stride;
};
struct Fold : Module {
    Fold(SpatialSizes output_size, SpatialSizes kernel_size, SpatialSizes dilation = 1,
         SpatialSizes padding = 0, SpatialSizes stride = 1)
        : output_size(output_size), kernel_size(kernel_size), dilation(dilation),
          padding(padding), stride(stride) {}
    Tensor forward(const Tensor& x) override;
    SpatialSizes output_size, kernel_size, dilation, padding, stride;
};
// functional::pad as a layer over the last 1, 2 or 3 axes: padding one size for every side, or
// (before, after) pairs from the last axis backward (left, right, top, bottom, front, back).
// ZeroPad, ConstantPad (value), ReflectionPad, ReplicationPad, CircularPad, 1d to 3d.
struct PadNd : Module {
    PadNd(const char* name, int spatial_axes, SpatialSizes padding, std::string mode,
          double value, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    std::vector<int64_t> pads;   // as functional::pad takes them
    std::string mode;
    double value;
};
template <int SpatialAxes> struct ZeroPad : PadNd {
    explicit ZeroPad(SpatialSizes padding, Loc loc = Loc::here())
        : PadNd("ZeroPad", SpatialAxes, padding, "constant", 0, loc) {}
};
template <int SpatialAxes> struct ConstantPad : PadNd {
    ConstantPad(SpatialSizes padding, double value, Loc loc = Loc::here())
        : PadNd("ConstantPad", SpatialAxes, padding, "constant", value, loc) {}
};
template <int SpatialAxes> struct ReflectionPad : PadNd {
    explicit ReflectionPad(SpatialSizes padding, Loc loc = Loc::here())
        : PadNd("ReflectionPad", SpatialAxes, padding, "reflect", 0, loc) {}
};
template <int SpatialAxes> struct ReplicationPad : PadNd {
    explicit ReplicationPad(SpatialSizes padding, Loc loc = Loc::here())
        : PadNd("ReplicationPad", SpatialAxes, padding, "replicate", 0, loc) {}
};
template <int SpatialAxes> struct CircularPad : PadNd {
    explicit CircularPad(SpatialSizes padding, Loc loc = Loc::here())
        : PadNd("CircularPad", SpatialAxes, padding, "circular", 0, loc) {}
};
using ZeroPad1d = ZeroPad<1>;
using ZeroPad2d = ZeroPad<2>;
using ZeroPad3d = ZeroPad<3>;
using ConstantPad1d = ConstantPad<1>;
using ConstantPad2d = ConstantPad<2>;
using ConstantPad3d = ConstantPad<3>;
using ReflectionPad1d = ReflectionPad<1>;
using ReflectionPad2d = ReflectionPad<2>;
using ReflectionPad3d = ReflectionPad<3>;
using ReplicationPad1d = ReplicationPad<1>;
using ReplicationPad2d = ReplicationPad<2>;
using ReplicationPad3d = ReplicationPad<3>;
using CircularPad1d = CircularPad<1>;
using CircularPad2d = CircularPad<2>;
using CircularPad3d = CircularPad<3>;

// functional::interpolate of x [N, C, *spatial] by scale_factor (to ⌊in·scale_factor⌋ along
// each spatial axis, reading at o / scale_factor) or to size, as PyTorch's nn.Upsample
struct Upsample : Module {
    explicit Upsample(double scale_factor, std::string mode = "nearest",
                      bool align_corners = false)
        : scale_factor(scale_factor), mode(std::move(mode)), align_corners(align_corners) {}
    explicit Upsample(SpatialSizes size, std::string mode = "nearest", bool align_corners = false)
        : size(std::move(size)), mode(std::move(mode)), align_corners(align_corners) {}
    Tensor forward(const Tensor& x) override;
    double scale_factor = 0;
    SpatialSizes size;   // none: by scale_factor
    std::string mode;
    bool align_corners;
};

// Layers held in order, named "0", "1", ...; it has no forward of its own (call its layers).
struct ModuleList : Module {
    ModuleList& add(std::shared_ptr<Module> layer, Loc loc = Loc::here());
    template <typename L> L& append(L layer) {   // a copy of layer, kept; returns it
        auto kept = std::make_shared<L>(std::move(layer));
        add(kept);
        return *kept;
    }
    // layer i as an L, else an error
    template <typename L = Module> L& at(size_t i, Loc loc = Loc::here()) {
        if (i >= layers.size() || !dynamic_cast<L*>(layers[i].get())) at_failed(i, loc);
        return *dynamic_cast<L*>(layers[i].get());
    }
    size_t size() const { return layers.size(); }
    Tensor forward(const Tensor& x) override;   // an error
    std::vector<std::pair<std::string, Module*>> children() override;
    std::vector<std::shared_ptr<Module>> layers;
private:
    [[noreturn]] void at_failed(size_t i, Loc loc) const;
};

// Layers in order: nn::Sequential mlp(nn::Linear(16), nn::ReLU(), nn::Linear(1));
// C++ constructs the arguments of one call in an order the compiler chooses, so the layers'
// seeds are handed out again in layer order: a seed gives the same model with every compiler.
struct Sequential : ModuleList {
    template <typename... Layers> explicit Sequential(Layers... layers) {
        (add(std::make_shared<Layers>(std::move(layers))), ...);
        std::vector<uint64_t> drawn;
        for (auto& l : this->layers) drawn.insert(drawn.end(), l->seeds.begin(), l->seeds.end());
        std::sort(drawn.begin(), drawn.end());
        reset_parameters(drawn);
    }
    Sequential& add(std::shared_ptr<Module> layer, Loc loc = Loc::here()) {
        ModuleList::add(std::move(layer), loc);
        return *this;
    }
    Tensor forward(const Tensor& x) override;
};

// Causal self-attention over x [batch, time, dim] in heads of dim / heads each, as GPT's: qkv
// makes the queries, keys and values, each position attends to itself and the positions before
// it (a mask of two aranges that fuses into the softmax: no [time, time] tensor is stored),
// attn_drop drops attention weights while training, and proj mixes the heads.
struct CausalSelfAttention : Module {
    CausalSelfAttention(int64_t dim, int64_t heads, double dropout = 0, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    std::vector<std::pair<std::string, Module*>> children() override;
    int64_t dim, heads;
    Linear qkv, proj;
    Dropout attn_drop;
};
// PyTorch's nn.MultiheadAttention: in_proj_weight [3E, E] (Xavier uniform) and in_proj_bias
// [3E] (zeros) make the queries, keys and values, split into heads of E / heads; out_proj
// (Linear(E, E), its bias zeros) mixes the heads. Keys of kdim and values of vdim features
// (0: E), where either is not E: q_proj_weight [E, E], k_proj_weight [E, kdim] and
// v_proj_weight [E, vdim] (each Xavier uniform) in place of in_proj_weight. add_bias_kv: one
// more key and value after the projections, bias_k and bias_v [1, 1, E] (Xavier normal);
// add_zero_attn: then one more of zeros in every head. Masks allow those extra keys. Inputs
// [L, N, E], [S, N, kdim], [S, N, vdim] (N first with batch_first, none without a batch).
// attn_mask [L, S] or [N·heads, L, S] and key_padding_mask [N, S]: bool, true where attention
// is not allowed (as PyTorch's module, unlike its scaled_dot_product_attention), or of the
// input's dtype, added to the scores. The output, and with need_weights the attention
// weights (after dropout, as PyTorch's), averaged over the heads [N, L, S] or each head's [N,
// heads, L, S] (S counting the extra keys). forward(x): self-attention, the output alone.
struct MultiheadAttention : Module {
    MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0,
                       bool bias = true, bool batch_first = false, bool add_bias_kv = false,
                       bool add_zero_attn = false, int64_t kdim = 0, int64_t vdim = 0,
                       Loc loc = Loc::here());
    struct Output {
        Tensor output, weights;   // weights: undefined without need_weights
    };
    Output forward(const Tensor& query, const Tensor& key, const Tensor& value,
                   const Tensor& key_padding_mask = Tensor(), bool need_weights = true,
                   const Tensor& attn_mask = Tensor(), bool average_attn_weights = true,
                   Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    Named named_parameters() override;
    std::vector<std::pair<std::string, Module*>> children() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    size_t own_seeds() const;   // those of its own parameters, before its children's
    int64_t embed_dim, num_heads, kdim, vdim;
    bool has_bias, batch_first, add_bias_kv, add_zero_attn;
    Tensor in_proj_weight, in_proj_bias;
    Tensor q_proj_weight, k_proj_weight, v_proj_weight;   // where kdim or vdim is not E
    Tensor bias_k, bias_v;
    Linear out_proj;
    Dropout attn_drop;
};
// A batch of sequences of different lengths, as PyTorch's nn.utils.rnn.PackedSequence: data
// [steps of all sequences, *] holds the first step of every sequence, then the second of those
// that have one, and so on, the sequences longest first (ties in batch order); batch_sizes[t]
// counts the sequences with a step t; sorted_indices[k] is the batch position of the k-th
// longest, unsorted_indices the inverse. A recurrent layer runs each its own length.
struct PackedSequence {
    Tensor data;
    std::vector<int64_t> batch_sizes, sorted_indices, unsorted_indices;
};
// input [T, N, *] ([N, T, *] with batch_first): sequence n is its first lengths[n] steps (1
// to T). enforce_sorted (PyTorch's default): the lengths must not increase along the batch.
PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first = false, bool enforce_sorted = true,
                                    Loc loc = Loc::here());
struct PaddedSequence {
    Tensor output;                  // [T, N, *] ([N, T, *] with batch_first)
    std::vector<int64_t> lengths;   // in batch order
};
// The inverse: steps past a sequence's length hold padding_value; T is the longest length, or
// total_length where given (not less)
PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first = false,
                                   double padding_value = 0, int64_t total_length = -1,
                                   Loc loc = Loc::here());
// sequences [L_n, *] (the same *) as [T, N, *] ([N, T, *] with batch_first), T the longest,
// each padded with padding_value
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                    double padding_value = 0, Loc loc = Loc::here());
PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted = true,
                             Loc loc = Loc::here());

// PyTorch's recurrent layers, each step from x_t and the state h (and LSTM's c):
//   RNN:  h' = tanh (or relu) of x_t·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh
//   LSTM: gates i, f, g, o of those sums (σ, σ, tanh, σ); c' = f·c + i·g, h' = o·tanh(c')
//   GRU:  gates r, z (σ); n = tanh(x_t·W_inᵀ + b_in + r·(h·W_hnᵀ + b_hn)); h' = n + z·(h - n)
// num_layers deep (a layer's outputs are the next one's inputs, through dropout while
// training, not after the last), and bidirectional: a second pass per layer from the last
// step back, its outputs joined after the first's. input [L, N, input_size] ([N, L, ...] with
// batch_first, [L, input_size] without a batch); output [L, N, D·hidden_size] (N first with
// batch_first), D = 2 if bidirectional; h_n (and c_n) [D·num_layers, N, hidden_size] (without
// N unbatched), as h_0 (and c_0): zeros where undefined. Parameters as PyTorch names, shapes
// and draws them: for layer k and direction (the second's names end in "_reverse")
// weight_ih_lk [G·hidden, in], weight_hh_lk [G·hidden, hidden], bias_ih_lk and bias_hh_lk
// [G·hidden], G the gates (1, 4, 3, in the order above), all U(-1/√hidden, 1/√hidden); the
// tensors are weight_ih[k·D + direction], and so on. An LSTM's proj_size P (0: none, else less
// than hidden_size) projects each step's h' by weight_hr_lk [P, hidden]: h and the outputs have
// P features (weight_hh_lk [4·hidden, P]), c keeps hidden_size. A layer's input products run
// over all its steps at once, then its steps one after another (a jitted step's program holds
// every step: see bench.cpp's R1).
struct RNNBase : Module {
    // mode: "RNN_TANH", "RNN_RELU", "LSTM" or "GRU"
    RNNBase(std::string mode, int64_t input_size, int64_t hidden_size, int64_t num_layers,
            bool bias, bool batch_first, double dropout, bool bidirectional,
            int64_t proj_size = 0, Loc loc = Loc::here());
    struct Output {
        Tensor output, h_n, c_n;   // c_n: LSTM's
    };
    Output forward(const Tensor& input, const Tensor& h_0, const Tensor& c_0 = Tensor(),
                   Loc loc = Loc::here());
    Tensor forward(const Tensor& input) override;   // the output from zeros
    // Each sequence runs its own steps (backward: from its last one): h_n and c_n are its
    // states after them, in batch order; the output is packed as the input.
    struct PackedOutput {
        PackedSequence output;
        Tensor h_n, c_n;
    };
    PackedOutput forward(const PackedSequence& input, const Tensor& h_0 = Tensor(),
                         const Tensor& c_0 = Tensor(), Loc loc = Loc::here());
    Named named_parameters() override;
    std::vector<std::pair<std::string, Module*>> children() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    int64_t cell_parameters() const;   // of each layer and direction
    std::string mode;
    int64_t input_size, hidden_size, num_layers, proj_size;
    bool has_bias, batch_first, bidirectional;
    std::vector<Tensor> weight_ih, weight_hh, bias_ih, bias_hh, weight_hr;
    Dropout drop;   // between layers
};
struct RNN : RNNBase {
    RNN(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1,
        const std::string& nonlinearity = "tanh", bool bias = true, bool batch_first = false,
        double dropout = 0, bool bidirectional = false, Loc loc = Loc::here());
};
struct LSTM : RNNBase {
    LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
         bool batch_first = false, double dropout = 0, bool bidirectional = false,
         int64_t proj_size = 0, Loc loc = Loc::here())
        : RNNBase("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                  bidirectional, proj_size, loc) {}
};
struct GRU : RNNBase {
    GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool bias = true,
        bool batch_first = false, double dropout = 0, bool bidirectional = false,
        Loc loc = Loc::here())
        : RNNBase("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                  bidirectional, 0, loc) {}
};
// One step of those layers: input [N, input_size] (or [input_size]), hx (and cx) [N,
// hidden_size] (or [hidden_size]), zeros where undefined; weight_ih, weight_hh, bias_ih and
// bias_hh as PyTorch's cells name them.
struct RNNCellBase : Module {
    RNNCellBase(std::string mode, int64_t input_size, int64_t hidden_size, bool bias,
                Loc loc = Loc::here());
    struct Output {
        Tensor h, c;   // c: LSTMCell's
    };
    Output forward(const Tensor& input, const Tensor& hx, const Tensor& cx = Tensor(),
                   Loc loc = Loc::here());
    Tensor forward(const Tensor& input) override;   // h' from zeros
    Named named_parameters() override;
    void reset_parameters(const std::vector<uint64_t>& new_seeds) override;
    std::string mode;
    int64_t input_size, hidden_size;
    bool has_bias;
    Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};
struct RNNCell : RNNCellBase {
    RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true,
            const std::string& nonlinearity = "tanh", Loc loc = Loc::here());
};
struct LSTMCell : RNNCellBase {
    LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true, Loc loc = Loc::here())
        : RNNCellBase("LSTM", input_size, hidden_size, bias, loc) {}
};
struct GRUCell : RNNCellBase {
    GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true, Loc loc = Loc::here())
        : RNNCellBase("GRU", input_size, hidden_size, bias, loc) {}
};
// GPT's pre-LayerNorm block: x + attn(ln1(x)), then + mlp(ln2(x)) with mlp Linear(dim, 4·dim),
// GELU (tanh approximation), Linear(4·dim, dim) and dropout p after attn and mlp.
// Its names: ln1, attn.qkv, attn.proj, ln2, mlp.0, mlp.2 (.weight, .bias).
struct TransformerBlock : Module {
    TransformerBlock(int64_t dim, int64_t heads, double dropout = 0, Loc loc = Loc::here());
    Tensor forward(const Tensor& x) override;
    std::vector<std::pair<std::string, Module*>> children() override;
    LayerNorm ln1;
    CausalSelfAttention attn;
    LayerNorm ln2;
    Sequential mlp;
    Dropout drop;
};

// PyTorch's nn.TransformerEncoderLayer: self-attention (MultiheadAttention), then a
// feed-forward network linear2(dropout(activation(linear1(x)))) ("relu" or "gelu"), each
// added to its input through dropout1 or dropout2, with LayerNorm after each sum (norm1, norm2)
// or, with norm_first, before each block. PyTorch's names and initialization. src [S, N, E]
// ([N, S, E] with batch_first, [S, E] unbatched); src_mask and src_key_padding_mask are
// MultiheadAttention's attn_mask and key_padding_mask (bool: true where not attended to);
// is_causal without a src_mask: a position attends to itself and those before it alone.
struct TransformerEncoderLayer : Module {
    TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                            double dropout = 0.1, const std::string& activation = "relu",
                            double layer_norm_eps = 1e-5, bool batch_first = false,
                            bool norm_first = false, bool bias = true, Loc loc = Loc::here());
    Tensor forward(const Tensor& src, const Tensor& src_mask,
                   const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
    Tensor forward(const Tensor& src) override;
    std::vector<std::pair<std::string, Module*>> children() override;
    MultiheadAttention self_attn;
    Linear linear1;
    Dropout dropout;
    Linear linear2;
    LayerNorm norm1, norm2;
    Dropout dropout1, dropout2;
    std::string activation;
    bool norm_first;
};
// PyTorch's nn.TransformerDecoderLayer: self-attention on tgt, then attention to memory
// (multihead_attn), then the feed-forward network, each as the encoder layer's, with norm1 to
// norm3 and dropout1 to dropout3. forward(x) is an error: it needs the memory.
struct TransformerDecoderLayer : Module {
    TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                            double dropout = 0.1, const std::string& activation = "relu",
                            double layer_norm_eps = 1e-5, bool batch_first = false,
                            bool norm_first = false, bool bias = true, Loc loc = Loc::here());
    Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                   const Tensor& memory_mask = Tensor(),
                   const Tensor& tgt_key_padding_mask = Tensor(),
                   const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false);
    Tensor forward(const Tensor& x) override;
    std::vector<std::pair<std::string, Module*>> children() override;
    MultiheadAttention self_attn, multihead_attn;
    Linear linear1;
    Dropout dropout;
    Linear linear2;
    LayerNorm norm1, norm2, norm3;
    Dropout dropout1, dropout2, dropout3;
    std::string activation;
    bool norm_first;
};
// num_layers copies of a layer, one after another (layers.0, layers.1, ...), then norm where
// given, as PyTorch's nn.TransformerEncoder and nn.TransformerDecoder: each copy starts with
// the given layer's values in tensors of its own (PyTorch's deep copies); norm is the given
// one itself
struct TransformerEncoder : Module {
    TransformerEncoder(TransformerEncoderLayer encoder_layer, int64_t num_layers,
                       std::optional<LayerNorm> norm = std::nullopt, Loc loc = Loc::here());
    Tensor forward(const Tensor& src, const Tensor& mask,
                   const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
    Tensor forward(const Tensor& src) override;
    std::vector<std::pair<std::string, Module*>> children() override;
    ModuleList layers;
    std::optional<LayerNorm> norm;
};
struct TransformerDecoder : Module {
    TransformerDecoder(TransformerDecoderLayer decoder_layer, int64_t num_layers,
                       std::optional<LayerNorm> norm = std::nullopt, Loc loc = Loc::here());
    Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                   const Tensor& memory_mask = Tensor(),
                   const Tensor& tgt_key_padding_mask = Tensor(),
                   const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false);
    Tensor forward(const Tensor& x) override;   // an error: it needs the memory
    std::vector<std::pair<std::string, Module*>> children() override;
    ModuleList layers;
    std::optional<LayerNorm> norm;
};

namespace init {   // fan_in/fan_out: inputs and outputs per unit; gain √2 for ReLU (kaiming)
Tensor kaiming_uniform(const Shape& shape, int64_t fan_in, uint64_t seed = Tensor::next_seed(),
                       Loc loc = Loc::here());
Tensor kaiming_normal(const Shape& shape, int64_t fan_in, uint64_t seed = Tensor::next_seed(),
                      Loc loc = Loc::here());
Tensor xavier_uniform(const Shape& shape, int64_t fan_in, int64_t fan_out,
                      uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
Tensor xavier_normal(const Shape& shape, int64_t fan_in, int64_t fan_out,
                     uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed = Tensor::next_seed(),
               Loc loc = Loc::here());
}  // namespace init

// MEAN: over the items (a loss with class weights divides by their sum); BATCHMEAN, kl_div's
// alone: the sum over the first axis's length, the KL divergence's per-sample mean
enum class Reduction { MEAN, SUM, NONE, BATCHMEAN };
// logits [N, C] (or [..., C]), target int32 or int64 [N] (or [...]): -log softmax(logits)
// [target], times weight[target] where a class weight [C] is given; a target equal to
// ignore_index (PyTorch's -100) adds 0 and no gradient, and the mean is over the others (the
// sum of their weights). label_smoothing ε mixes in the uniform target: (1 - ε)·that + ε/C·
// -Σ_c weight_c·log softmax(logits)_c. A float target of the logits' shape holds each class's
// probability: -Σ_c weight_c·t_c·log softmax(logits)_c, with t smoothed the same way, the mean
// over the rows. PyTorch's layout, logits [N, C, d...] with targets [N, d...], is taken too
// where the class indices' shape fits it and not the classes-last one.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction r = Reduction::MEAN,
                     int64_t ignore_index = -100, double label_smoothing = 0,
                     const Tensor& weight = Tensor(), Loc loc = Loc::here());
// -log_probs[target]·weight[target], as cross_entropy after log_softmax (classes on the last
// axis, or on axis 1 where the targets' shape says so)
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction r = Reduction::MEAN,
                int64_t ignore_index = -100, const Tensor& weight = Tensor(),
                Loc loc = Loc::here());
// -(t·ln p + (1 - t)·ln(1 - p)) for probabilities p, each logarithm at least -100, and the
// gradient (p - t)/max(p(1 - p), 1e-12), as PyTorch's: finite at p = 0 and 1 (a p outside
// [0, 1] gives NaN); binary_cross_entropy_with_logits is steadier. weight (broadcast to p's
// shape) scales each item's loss.
Tensor binary_cross_entropy(const Tensor& probabilities, const Tensor& target,
                           Reduction r = Reduction::MEAN, const Tensor& weight = Tensor(),
                           Loc loc = Loc::here());
// (1 - t)·x - (1 + (pos_weight - 1)·t)·ln σ(x), targets in [0, 1], times weight; pos_weight
// (one per class, on the last axis, or broadcast) weighs the positive targets' term
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction r = Reduction::MEAN,
                                        const Tensor& weight = Tensor(),
                                        const Tensor& pos_weight = Tensor(),
                                        Loc loc = Loc::here());
// The Kullback-Leibler divergence of input's distribution from target's, input holding log
// probabilities: t·(ln t - input) (0 where t = 0), or e^t·(t - input) with log_target. MEAN
// is over every element, as PyTorch's; BATCHMEAN gives the divergence per sample.
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction r = Reduction::MEAN,
              bool log_target = false, Loc loc = Loc::here());
Tensor mse_loss(const Tensor& prediction, const Tensor& target, Reduction r = Reduction::MEAN,
                Loc loc = Loc::here());
Tensor l1_loss(const Tensor& prediction, const Tensor& target, Reduction r = Reduction::MEAN,
               Loc loc = Loc::here());   // |prediction - target|
// d = |prediction - target|: d²/(2β) where d < β, else d - β/2 (β = 0: l1_loss)
Tensor smooth_l1_loss(const Tensor& prediction, const Tensor& target,
                      Reduction r = Reduction::MEAN, double beta = 1, Loc loc = Loc::here());
// d²/2 where d <= δ, else δ(d - δ/2): smooth_l1_loss times δ (with β = δ)
Tensor huber_loss(const Tensor& prediction, const Tensor& target, Reduction r = Reduction::MEAN,
                  double delta = 1, Loc loc = Loc::here());
// relu(1 - y·score) with labels y = ±1: the margin loss of a support vector machine
Tensor hinge_loss(const Tensor& scores, const Tensor& labels, Reduction r = Reduction::MEAN,
                  Loc loc = Loc::here());
// More of PyTorch's losses, each with the reduction after the tensors, then PyTorch's options
// in its order. max(0, margin - target·(x1 - x2)), target ±1, the three broadcast (of one rank)
Tensor margin_ranking_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                           Reduction r = Reduction::MEAN, double margin = 0, Loc loc = Loc::here());
// x where target is 1, max(0, margin - x) where it is -1 (target x's shape)
Tensor hinge_embedding_loss(const Tensor& x, const Tensor& target, Reduction r = Reduction::MEAN,
                            double margin = 1, Loc loc = Loc::here());
// ln(1 + e^(-target·x)), target ±1 of x's shape
Tensor soft_margin_loss(const Tensor& x, const Tensor& target, Reduction r = Reduction::MEAN,
                        Loc loc = Loc::here());
// -(t·ln σ(x) + (1 - t)·ln σ(-x)), times weight (one per class, where given), averaged over the
// classes (the last axis): one loss per sample before the reduction
Tensor multilabel_soft_margin_loss(const Tensor& x, const Tensor& target,
                                   Reduction r = Reduction::MEAN, const Tensor& weight = Tensor(),
                                   Loc loc = Loc::here());
// 1 - cos(x1, x2) where target is 1, max(0, cos - margin) where it is -1: x1, x2 [N, D] with
// target [N], or [D] with a scalar target; cos = x1·x2 / √((‖x1‖² + 10⁻¹²)(‖x2‖² + 10⁻¹²))
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             Reduction r = Reduction::MEAN, double margin = 0,
                             Loc loc = Loc::here());
// ‖x1 - x2 + eps‖_p over the last axis, x1 and x2 broadcast
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2, double eps = 1e-6,
                         bool keepdim = false, Loc loc = Loc::here());
// max(0, margin + d(anchor, positive) - d(anchor, negative)), d pairwise_distance; swap: the
// second distance the smaller of it and d(positive, negative)
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           Reduction r = Reduction::MEAN, double margin = 1, double p = 2,
                           double eps = 1e-6, bool swap = false, Loc loc = Loc::here());
// (ln v + (x - target)²/v)/2 (+ ln(2π)/2 where full), v = var at least eps: var of x's shape,
// or that shape with its last axis 1 or dropped (one variance for the axis). As PyTorch's, the
// gradient passes the clamp at eps unchanged; a negative var is not refused (PyTorch reads the
// values to refuse it), it counts as eps.
Tensor gaussian_nll_loss(const Tensor& x, const Tensor& target, const Tensor& var,
                         Reduction r = Reduction::MEAN, bool full = false, double eps = 1e-6,
                         Loc loc = Loc::here());
// e^x - target·x (log_input), else x - target·ln(x + eps); full adds Stirling's approximation
// of ln(target!) where target > 1: target·ln target - target + ln(2π·target)/2
Tensor poisson_nll_loss(const Tensor& x, const Tensor& target, Reduction r = Reduction::MEAN,
                        bool log_input = true, bool full = false, double eps = 1e-8,
                        Loc loc = Loc::here());
// Σ over the classes c other than the target y of max(0, margin - x_y + x_c)^p (p 1 or 2),
// times weight[y] where given, divided by the classes: x [N, C] with target [N] (int), or [C]
// with a scalar target
Tensor multi_margin_loss(const Tensor& x, const Tensor& target, Reduction r = Reduction::MEAN,
                         double p = 1, double margin = 1, const Tensor& weight = Tensor(),
                         Loc loc = Loc::here());

// Scales the gradients of params so that their global norm is at most max_norm: each times
// min(1, max_norm / (norm + 1e-6)), as PyTorch's; lazily, so the scaling joins the optimizer's
// program (and a jitted step). The norm: the norm_type-norm of the gradients' norms (INFINITY:
// the largest |g|). Returns it, before clipping.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2,
                       Loc loc = Loc::here());
// Clamps each gradient to [-clip_value, clip_value], lazily as clip_grad_norm_
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value,
                      Loc loc = Loc::here());
// The parameters flattened and joined, in order; vector_to_parameters copies such a vector's
// pieces back into them (in one program)
Tensor parameters_to_vector(const std::vector<Tensor>& params, Loc loc = Loc::here());
void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& params,
                          Loc loc = Loc::here());

// PyTorch's torch.nn.functional as free functions: namespace F = tg::nn::functional;
namespace functional {
inline Tensor relu(const Tensor& x, Loc loc = Loc::here()) { return x.relu(loc); }
inline Tensor gelu(const Tensor& x, bool tanh_approximation = false, Loc loc = Loc::here()) {
    return x.gelu(tanh_approximation, loc);
}
inline Tensor sigmoid(const Tensor& x, Loc loc = Loc::here()) { return x.sigmoid(loc); }
inline Tensor tanh(const Tensor& x, Loc loc = Loc::here()) { return x.tanh(loc); }
inline Tensor silu(const Tensor& x, Loc loc = Loc::here()) { return x.silu(loc); }
inline Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01, Loc loc = Loc::here()) {
    return x.leaky_relu(negative_slope, loc);
}
inline Tensor elu(const Tensor& x, double alpha = 1, Loc loc = Loc::here()) {
    return x.elu(alpha, loc);
}
inline Tensor softplus(const Tensor& x, double beta = 1, double threshold = 20,
                       Loc loc = Loc::here()) {
    return x.softplus(beta, threshold, loc);
}
inline Tensor softmax(const Tensor& x, int axis = -1, Loc loc = Loc::here()) {
    return x.softmax(axis, loc);
}
inline Tensor log_softmax(const Tensor& x, int axis = -1, Loc loc = Loc::here()) {
    return x.log_softmax(axis, loc);
}
// More activations, as PyTorch's (its values, at a NaN too, and its gradients at the kinks):
// hardtanh: x clamped to [min_val, max_val] (gradient 0 at either end); relu6: hardtanh(0, 6)
Tensor hardtanh(const Tensor& x, double min_val = -1, double max_val = 1, Loc loc = Loc::here());
Tensor relu6(const Tensor& x, Loc loc = Loc::here());
// hardsigmoid: 0 up to -3, x/6 + 1/2, 1 from 3; hardswish: x·hardsigmoid(x)
Tensor hardsigmoid(const Tensor& x, Loc loc = Loc::here());
Tensor hardswish(const Tensor& x, Loc loc = Loc::here());
Tensor mish(const Tensor& x, Loc loc = Loc::here());       // x·tanh(softplus(x))
Tensor selu(const Tensor& x, Loc loc = Loc::here());       // 1.0507·elu(x, 1.67326)
Tensor celu(const Tensor& x, double alpha = 1, Loc loc = Loc::here());   // α·elu(x/α)
Tensor softsign(const Tensor& x, Loc loc = Loc::here());   // x / (1 + |x|)
Tensor logsigmoid(const Tensor& x, Loc loc = Loc::here());   // ln σ(x) = -softplus(-x)
Tensor tanhshrink(const Tensor& x, Loc loc = Loc::here());   // x - tanh(x)
// hardshrink: x where |x| > lambd, else 0; softshrink: x ∓ lambd there, else 0 (lambd >= 0)
Tensor hardshrink(const Tensor& x, double lambd = 0.5, Loc loc = Loc::here());
Tensor softshrink(const Tensor& x, double lambd = 0.5, Loc loc = Loc::here());
// x where x > threshold, else value
Tensor threshold(const Tensor& x, double threshold, double value, Loc loc = Loc::here());
// glu: a·σ(b) for a, b the halves of x along the axis (its length even); softmin:
// softmax(-x)
Tensor glu(const Tensor& x, int axis = -1, Loc loc = Loc::here());
Tensor softmin(const Tensor& x, int axis = -1, Loc loc = Loc::here());
// x1ᵀ A_o x2 + b_o for each o: x1 [..., in1], x2 [..., in2], weight [out, in1, in2], bias [out]
Tensor bilinear(const Tensor& x1, const Tensor& x2, const Tensor& weight,
                const Tensor& bias = Tensor(), Loc loc = Loc::here());
// x where x > 0, else weight·x: weight [1], or [C] along axis 1 of x [N, C, ...]
Tensor prelu(const Tensor& x, const Tensor& weight, Loc loc = Loc::here());
inline Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::here()) {
    return a.matmul(b, loc);
}
// x Wᵀ + b with W [out, in]; bias optional
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Loc loc = Loc::here());
// softmax(q kᵀ / √d) v over the last two axes: q [..., L, d], k [..., S, d], v [..., S, dv];
// is_causal: query i sees keys j <= i only (a mask that fuses into the softmax)
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal = false, Loc loc = Loc::here());
// the same with PyTorch's other arguments, in its order: attn_mask broadcast to [..., L, S],
// bool (true: the key takes part) or of q's dtype (added to the scores), not with
// is_causal; dropout_p: dropout of the weights (always, as PyTorch's functional form);
// scale: the scores' factor in place of 1/√d
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p = 0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Loc loc = Loc::here());
// Convolution as PyTorch's (a cross-correlation: the kernel is not flipped) of x [N, C_in,
// *spatial] (or [C_in, *spatial]) with weight [C_out, C_in / groups, *kernel], plus bias
// [C_out] where given: [N, C_out, *out], out = (spatial + 2·padding - dilation·(kernel - 1) -
// 1) / stride + 1 along each axis. Composed: the sum, over the kernel's positions, of the
// products of that position's weights with x seen through strided views (no copies of x).
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              SpatialSizes stride = 1, ConvPadding padding = 0, SpatialSizes dilation = 1,
              int64_t groups = 1, Loc loc = Loc::here());
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              SpatialSizes stride = 1, ConvPadding padding = 0, SpatialSizes dilation = 1,
              int64_t groups = 1, Loc loc = Loc::here());
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              SpatialSizes stride = 1, ConvPadding padding = 0, SpatialSizes dilation = 1,
              int64_t groups = 1, Loc loc = Loc::here());
// The transposed convolution (conv's gradient with respect to its input), as PyTorch's: x
// [N, C_in, *spatial] (or [C_in, *spatial]) with weight [C_in, C_out / groups, *kernel], plus
// bias [C_out]: [N, C_out, *out], out = (spatial - 1)·stride - 2·padding + dilation·(kernel -
// 1) + output_padding + 1. Composed: with dilation 1, one convolution of x for each phase of
// the output (o + padding) mod stride, with the kernel's taps of that phase flipped, the
// phases interleaved (the products of a scatter, no more); with other dilations, x with
// stride - 1 zeros between its elements convolved with the kernel flipped.
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        SpatialSizes stride = 1, SpatialSizes padding = 0,
                        SpatialSizes output_padding = 0, int64_t groups = 1,
                        SpatialSizes dilation = 1, Loc loc = Loc::here());
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        SpatialSizes stride = 1, SpatialSizes padding = 0,
                        SpatialSizes output_padding = 0, int64_t groups = 1,
                        SpatialSizes dilation = 1, Loc loc = Loc::here());
Tensor conv_transpose3d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        SpatialSizes stride = 1, SpatialSizes padding = 0,
                        SpatialSizes output_padding = 0, int64_t groups = 1,
                        SpatialSizes dilation = 1, Loc loc = Loc::here());
// The largest value of each window of x [N, C, *spatial] (or [C, *spatial]; floating point),
// its gradient to the first largest in the window (NaN above all), as PyTorch's; the padding
// is -∞, at most half the kernel; stride {}: the kernel. ceil_mode: a last window that runs
// past the padding counts too, if it starts inside x or the padding before it (PyTorch's
// rule).
Tensor max_pool1d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, SpatialSizes dilation = 1, bool ceil_mode = false,
                  Loc loc = Loc::here());
Tensor max_pool2d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, SpatialSizes dilation = 1, bool ceil_mode = false,
                  Loc loc = Loc::here());
Tensor max_pool3d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, SpatialSizes dilation = 1, bool ceil_mode = false,
                  Loc loc = Loc::here());
// max_pool and where each window's largest lies: its index into x's spatial axes flattened,
// int64, as PyTorch's return_indices=True; auto [y, indices] = max_pool2d_with_indices(x, 2)
ValuesIndices max_pool1d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride = {}, SpatialSizes padding = 0,
                                      SpatialSizes dilation = 1, bool ceil_mode = false,
                                      Loc loc = Loc::here());
ValuesIndices max_pool2d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride = {}, SpatialSizes padding = 0,
                                      SpatialSizes dilation = 1, bool ceil_mode = false,
                                      Loc loc = Loc::here());
ValuesIndices max_pool3d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride = {}, SpatialSizes padding = 0,
                                      SpatialSizes dilation = 1, bool ceil_mode = false,
                                      Loc loc = Loc::here());
// max_pool undone: x [N, C, *windows] (or [C, ...]) written at indices (max_pool's) of zeros
// [N, C, *output_size], by default (windows - 1)·stride - 2·padding + kernel along each axis,
// as torch's max_unpool; of repeated indices (overlapping windows) the last is written and
// gets the gradient
Tensor max_unpool1d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride = {}, SpatialSizes padding = 0,
                    SpatialSizes output_size = {}, Loc loc = Loc::here());
Tensor max_unpool2d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride = {}, SpatialSizes padding = 0,
                    SpatialSizes output_size = {}, Loc loc = Loc::here());
Tensor max_unpool3d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride = {}, SpatialSizes padding = 0,
                    SpatialSizes output_size = {}, Loc loc = Loc::here());
// The mean of each window, the padding 0 and counted (count_include_pad) or not; ceil_mode as
// max_pool's, a window's part past the padding never counted; divisor_override: each window's
// sum divided by it instead. (PyTorch takes ceil_mode before count_include_pad.)
Tensor avg_pool1d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, bool count_include_pad = true, bool ceil_mode = false,
                  std::optional<int64_t> divisor_override = std::nullopt, Loc loc = Loc::here());
Tensor avg_pool2d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, bool count_include_pad = true, bool ceil_mode = false,
                  std::optional<int64_t> divisor_override = std::nullopt, Loc loc = Loc::here());
Tensor avg_pool3d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride = {},
                  SpatialSizes padding = 0, bool count_include_pad = true, bool ceil_mode = false,
                  std::optional<int64_t> divisor_override = std::nullopt, Loc loc = Loc::here());
// (Σ x^p)^(1/p) over each window, as PyTorch's: kernel size · avg_pool(x^p), its sign kept,
// to the power 1/p (with ceil_mode, a window cut short by the end is scaled up so)
Tensor lp_pool1d(const Tensor& x, double norm_type, SpatialSizes kernel_size,
                 SpatialSizes stride = {}, bool ceil_mode = false, Loc loc = Loc::here());
Tensor lp_pool2d(const Tensor& x, double norm_type, SpatialSizes kernel_size,
                 SpatialSizes stride = {}, bool ceil_mode = false, Loc loc = Loc::here());
// rows of weight [num, dim] picked by int32 or int64 ids, each in [0, num) (checked when the
// program runs; unlike x[ids], a negative id is an error, as in PyTorch); the row padding_idx
// gets no gradient
Tensor embedding(const Tensor& ids, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt, Loc loc = Loc::here());
// PyTorch's F.embedding_bag: the rows of weight picked by ids, reduced over each bag by mode
// "mean", "sum" (each row times its per_sample_weights entry, where given) or "max" (its
// gradient to the first largest). ids [bags, length] (offsets undefined) or ids [n] with
// offsets [bags], each bag's first position in increasing order (include_last_offset: one
// more, n; a position before the first offset is in no bag). An id equal to padding_idx
// counts in no bag; an empty bag gives zeros.
Tensor embedding_bag(const Tensor& ids, const Tensor& weight, const Tensor& offsets = Tensor(),
                     const std::string& mode = "mean", const Tensor& per_sample_weights = Tensor(),
                     bool include_last_offset = false,
                     std::optional<int64_t> padding_idx = std::nullopt, Loc loc = Loc::here());
// (x - mean)/√(var + eps) over the last axis, then · weight + bias where given
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5, Loc loc = Loc::here());
// the same over x's last axes, normalized_shape, as PyTorch's F.layer_norm
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5, Loc loc = Loc::here());
// x/√(mean(x²) + eps) over x's last axes, normalized_shape, then · weight where given; eps
// std::nullopt: the spacing of x's floats at 1 (as PyTorch's F.rms_norm)
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt, Loc loc = Loc::here());
// x [N, C, *] normalized over groups of C / groups channels (as nn::GroupNorm), then
// · weight + bias per channel where given
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5, Loc loc = Loc::here());
// x [N, C, *] normalized per channel (as nn::BatchNorm's forward): training, by the batch's
// statistics, moving running_mean and running_var (where given) toward them; else by
// running_mean and running_var
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  bool training = false, double momentum = 0.1, double eps = 1e-5,
                  Loc loc = Loc::here());
// x [N, C, *spatial] normalized per sample and channel over its positions (as
// nn::InstanceNorm's forward), then · weight + bias per channel where given. use_input_stats:
// by those statistics, moving running_mean and running_var (where given) toward their mean
// over the samples; else by running_mean and running_var.
Tensor instance_norm(const Tensor& x, const Tensor& running_mean = Tensor(),
                     const Tensor& running_var = Tensor(), const Tensor& weight = Tensor(),
                     const Tensor& bias = Tensor(), bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5, Loc loc = Loc::here());
// x [N, C, *] / (k + α/size·Σ x²)^β over the size channels around each (nn::LocalResponseNorm)
Tensor local_response_norm(const Tensor& x, int64_t size, double alpha = 1e-4,
                           double beta = 0.75, double k = 1, Loc loc = Loc::here());
// x / max(‖x‖_p, eps) along the axis
Tensor normalize(const Tensor& x, double p = 2, int axis = 1, double eps = 1e-12,
                 Loc loc = Loc::here());
// x1·x2 / (max(‖x1‖, eps) · max(‖x2‖, eps)) along the axis, x1 and x2 broadcast
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int axis = 1, double eps = 1e-8,
                         Loc loc = Loc::here());
// The mean of each of output_size bins along each spatial axis of x [N, C, *spatial] (or
// [C, *spatial]): bin i of n inputs covers [⌊i·n/out⌋, ⌈(i + 1)·n/out⌉), as PyTorch's
Tensor adaptive_avg_pool1d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
Tensor adaptive_avg_pool2d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
Tensor adaptive_avg_pool3d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
// The largest of each bin (the bins as adaptive_avg_pool's), its gradient to the first
// largest in row-major order
Tensor adaptive_max_pool1d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
Tensor adaptive_max_pool2d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
Tensor adaptive_max_pool3d(const Tensor& x, SpatialSizes output_size, Loc loc = Loc::here());
// PyTorch's F.pad: pads holds (before, after) pairs from the last axis backward; mode
// "constant" (value), "reflect" (mirrored about the edge, which is not repeated),
// "replicate" (the edge repeated) or "circular" (wrapped around); in every mode a negative
// size cuts
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads,
           const std::string& mode = "constant", double value = 0, Loc loc = Loc::here());
// x [N, C, *spatial] (or [C, *spatial]) resized along its spatial axes to size, as PyTorch's
// interpolate. Output o of an axis reads input ⌊o·in/out⌋ ("nearest") or ⌊(o + 1/2)·in/out⌋
// ("nearest-exact"), or weighs the two inputs around (o + 1/2)·in/out - 1/2 ("linear",
// "bilinear", "trilinear": one, two or three axes, the last first; clamped at 0), around
// o·(in - 1)/(out - 1) with align_corners;
// "bicubic" (two axes) weighs the four around it, the edge's repeated past it, by Keys' cubic
// with a = -0.75, as PyTorch; "area" is adaptive_avg_pool. An axis enlarged by a power of two
// in a nearest mode is a view, each input repeated (its gradient sums the copies)
Tensor interpolate(const Tensor& x, SpatialSizes size, const std::string& mode = "nearest",
                   bool align_corners = false, Loc loc = Loc::here());
// ... by scale_factor: to ⌊in·scale_factor⌋, in/out above read as 1/scale_factor (PyTorch's
// recompute_scale_factor: as in/out, as interpolate to that size)
Tensor interpolate(const Tensor& x, ScaleFactor scale_factor, const std::string& mode = "nearest",
                   bool align_corners = false, bool recompute_scale_factor = false,
                   Loc loc = Loc::here());
// int64 [..., num_classes]: 1 at each id (num_classes -1: the largest id + 1, which reads ids);
// an id outside [0, num_classes) stops the program with an index error, as PyTorch raises
Tensor one_hot(const Tensor& ids, int64_t num_classes = -1, Loc loc = Loc::here());
// as nn::Dropout while training, with a mask drawn from seed; x itself when not training
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true,
               uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
// as nn::Dropout1d/2d/3d while training: whole channels of x [N, C, *spatial] or [C, *spatial]
Tensor dropout1d(const Tensor& x, double p = 0.5, bool training = true,
                 uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
Tensor dropout2d(const Tensor& x, double p = 0.5, bool training = true,
                 uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
Tensor dropout3d(const Tensor& x, double p = 0.5, bool training = true,
                 uint64_t seed = Tensor::next_seed(), Loc loc = Loc::here());
// [*, C·r², H, W] to [*, C, H·r, W·r]: the r² channels of each output channel spread over
// r x r pixels; pixel_unshuffle undoes it
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor, Loc loc = Loc::here());
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor, Loc loc = Loc::here());
// x [N, C, *] with its channels as [groups, C / groups], transposed to [C / groups, groups]
Tensor channel_shuffle(const Tensor& x, int64_t groups, Loc loc = Loc::here());
// im2col: x [N, C, H, W] (or [C, H, W]) to the columns [N, C·kh·kw, L] of its L windows (a
// column's elements channel by channel, each channel's in row-major order), as PyTorch's;
// fold sums such columns back into [N, C, *output_size], overlapping windows adding
Tensor unfold(const Tensor& x, SpatialSizes kernel_size, SpatialSizes dilation = 1,
              SpatialSizes padding = 0, SpatialSizes stride = 1, Loc loc = Loc::here());
Tensor fold(const Tensor& x, SpatialSizes output_size, SpatialSizes kernel_size,
            SpatialSizes dilation = 1, SpatialSizes padding = 0, SpatialSizes stride = 1,
            Loc loc = Loc::here());
using nn::binary_cross_entropy;
using nn::binary_cross_entropy_with_logits;
using nn::cosine_embedding_loss;
using nn::cross_entropy;
using nn::gaussian_nll_loss;
using nn::hinge_embedding_loss;
using nn::hinge_loss;
using nn::huber_loss;
using nn::kl_div;
using nn::l1_loss;
using nn::margin_ranking_loss;
using nn::mse_loss;
using nn::multi_margin_loss;
using nn::multilabel_soft_margin_loss;
using nn::nll_loss;
using nn::pairwise_distance;
using nn::poisson_nll_loss;
using nn::smooth_l1_loss;
using nn::soft_margin_loss;
using nn::triplet_margin_loss;
}  // namespace functional
}  // namespace nn

// ---- [OPTIM] optimizers: one program updates every parameter in place ------------------- >>optim
namespace optim {
// The learning rate of step t (1, 2, ...) as a tensor computed from the step count, so that a
// schedule runs inside the update program: nothing recompiles, a jitted step follows it.
using Schedule = std::function<Tensor(const Tensor& t)>;
// linear warm-up from peak/warmup to peak over the first warmup steps, then half a cosine down
// to min_lr at step total (min_lr after it), as nanoGPT's
Schedule warmup_cosine(double peak_lr, int64_t warmup, int64_t total, double min_lr = 0,
                       Loc loc = Loc::here());
// PyTorch's schedulers in closed form, for one scheduler.step() after each optimizer step:
// step t uses the rate they give after t - 1 of those. StepLR: lr·gamma^⌊(t - 1)/step_size⌋
Schedule step_lr(double lr, int64_t step_size, double gamma = 0.1, Loc loc = Loc::here());
// ExponentialLR: lr·gamma^(t - 1)
Schedule exponential_lr(double lr, double gamma, Loc loc = Loc::here());
// CosineAnnealingLR: eta_min + (lr - eta_min)·(1 + cos(π·(t - 1)/t_max))/2
Schedule cosine_annealing_lr(double lr, int64_t t_max, double eta_min = 0, Loc loc = Loc::here());
// LinearLR: lr times a factor going linearly from start_factor to end_factor over total_iters
// steps, then end_factor
Schedule linear_lr(double lr, double start_factor = 1.0 / 3, double end_factor = 1.0,
                   int64_t total_iters = 5, Loc loc = Loc::here());
// MultiStepLR: lr·gamma^(the milestones at most t - 1)
Schedule multi_step_lr(double lr, std::vector<int64_t> milestones, double gamma = 0.1,
                       Loc loc = Loc::here());
// OneCycleLR (its momentum left alone, as cycle_momentum=False): from max_lr/div_factor up to
// max_lr over the first pct_start of total_steps, then down to max_lr/div_factor/
// final_div_factor at the last, by half a cosine (cosine) or linearly; three_phase: back to
// the first rate over as many steps, then down to the last. After total_steps, the last rate.
Schedule one_cycle_lr(double max_lr, int64_t total_steps, double pct_start = 0.3,
                      bool cosine = true, double div_factor = 25, double final_div_factor = 1e4,
                      bool three_phase = false, Loc loc = Loc::here());
// ConstantLR: lr·factor for the first total_iters steps, then lr
Schedule constant_lr(double lr, double factor = 1.0 / 3, int64_t total_iters = 5,
                     Loc loc = Loc::here());
// PolynomialLR: lr·(1 - min(t - 1, total_iters)/total_iters)^power
Schedule polynomial_lr(double lr, int64_t total_iters = 5, double power = 1,
                       Loc loc = Loc::here());
// CosineAnnealingWarmRestarts: cosine_annealing_lr's half cosine over t_0 steps, then again
// over t_0·t_mult, t_0·t_mult², ... (t_mult a whole number), each starting back at lr
Schedule cosine_annealing_warm_restarts(double lr, int64_t t_0, int64_t t_mult = 1,
                                        double eta_min = 0, Loc loc = Loc::here());
// CyclicLR (its momentum left alone, as cycle_momentum=False): from base_lr up to max_lr
// linearly over step_size_up steps and back over step_size_down (std::nullopt: as many), again
// and again; mode "triangular", "triangular2" (each cycle's height half the last's) or
// "exp_range" (the height times gamma^(t - 1))
Schedule cyclic_lr(double base_lr, double max_lr, int64_t step_size_up = 2000,
                   std::optional<int64_t> step_size_down = std::nullopt,
                   const std::string& mode = "triangular", double gamma = 1,
                   Loc loc = Loc::here());

// Parameters with settings of their own, as PyTorch's param groups (each optimizer takes a list
// of groups where it takes parameters): weight_decay, and lr, which follows the optimizer's:
// the group's rate at a step is the optimizer's (lr, set_lr's or the schedule's) times
// group lr / optimizer lr. Unset, the optimizer's.
//   AdamW opt({{decayed, std::nullopt, 0.1}, {biases_and_norms, std::nullopt, 0.0}}, 6e-4);
struct ParamGroup {
    ParamGroup(std::vector<Tensor> group_params, std::optional<double> group_lr = std::nullopt,
               std::optional<double> group_weight_decay = std::nullopt)
        : params(std::move(group_params)), lr(group_lr), weight_decay(group_weight_decay) {}
    std::vector<Tensor> params;
    std::optional<double> lr, weight_decay;
};

// Each refuses a setting PyTorch's refuses: a negative (or NaN) lr, momentum, weight_decay,
// eps, alpha, lr_decay or initial_accumulator_value, betas outside [0, 1), Nesterov without
// momentum; and a parameter in two groups.
class Optimizer {
public:
    Optimizer(std::vector<Tensor> params, double lr, Loc loc = Loc::here());
    virtual ~Optimizer() = default;
    void step(Loc loc = Loc::here());   // all updates in one program, with backward's results
    void zero_grad();
    // writes the lr tensor's buffer: nothing recompiles
    void set_lr(double lr, Loc loc = Loc::here());
    // "t" (steps taken), "lr" and each parameter's state ("state.3.exp_avg"): checkpoints
    // with tg::safetensors; load_state_dict copies them back (shapes checked first; a state
    // saved before parameters counted their skipped steps loads with 0 for each)
    std::map<std::string, Tensor> state_dict();
    void load_state_dict(const std::map<std::string, Tensor>& state, Loc loc = Loc::here());
    std::vector<Tensor> params;
    Tensor lr;                    // a realized float32 scalar read by the update program
    Tensor t;                     // steps taken, a float32 tensor so a jitted step counts too
    Schedule schedule;            // set: the learning rate of each step instead of lr
protected:
    virtual std::vector<Tensor> updates() = 0;   // the assignments of one step
    // each parameter's state tensors by name ("exp_avg"), in params' order (none by default)
    virtual std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() { return {}; }
    // the groups' settings for params (in their order), checked; by the constructors that
    // take groups
    void set_groups(const std::vector<ParamGroup>& groups, double optimizer_lr, const char* who,
                    Loc loc);
    Tensor lr_of(size_t i) const;                            // step_lr for parameter i
    double weight_decay_of(size_t i, double optimizers) const;
    Tensor step_t, step_lr;       // in updates(): this step's count (t + 1) and learning rate
private:
    std::vector<double> lr_scales;                        // per parameter; empty: all 1
    std::vector<std::optional<double>> weight_decays;     // per parameter; empty: none set
};
// the parameters of groups, in order
std::vector<Tensor> params_of(const std::vector<ParamGroup>& groups);
// OCANNL's sgd_one: d = g + wd·p; with momentum b = μ·b + (1 - dampening)·d and d = b
// (Nesterov: d + μ·b); p = p - lr·d. As PyTorch's, b starts as the parameter's first d,
// undamped (with dampening, its first step is found as Adam's is: "state.i.skipped").
class SGD : public Optimizer {
public:
    SGD(std::vector<Tensor> params, double lr, double momentum = 0, double weight_decay = 0,
        bool nesterov = false, double dampening = 0, Loc loc = Loc::here());
    SGD(const std::vector<ParamGroup>& groups, double lr, double momentum = 0,
        double weight_decay = 0, bool nesterov = false, double dampening = 0,
        Loc loc = Loc::here())
        : SGD(params_of(groups), lr, momentum, weight_decay, nesterov, dampening, loc) {
        set_groups(groups, lr, "SGD", loc);
    }
    double momentum, weight_decay;
    bool nesterov;
    double dampening;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> buffers, skipped;
};
// m = β1 m + (1-β1) g, v = β2 v + (1-β2) g², p -= lr·m̂/(√v̂ + eps) with bias-corrected m̂, v̂;
// weight_decay adds wd·p to g (Adam) or subtracts lr·wd·p from p (AdamW, decoupled). As in
// PyTorch, t counts a parameter's own steps, those it had a gradient in: t less the steps it
// had none in ("state.i.skipped"), so a parameter that first gets one late starts its bias
// correction there. amsgrad: v̂ from the largest v so far ("state.i.max_exp_avg_sq").
class Adam : public Optimizer {
public:
    Adam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
         double eps = 1e-8, double weight_decay = 0, bool decoupled = false,
         bool amsgrad = false, Loc loc = Loc::here());
    Adam(const std::vector<ParamGroup>& groups, double lr = 1e-3, double beta1 = 0.9,
         double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
         bool decoupled = false, bool amsgrad = false, Loc loc = Loc::here())
        : Adam(params_of(groups), lr, beta1, beta2, eps, weight_decay, decoupled, amsgrad, loc) {
        set_groups(groups, lr, decoupled ? "AdamW" : "Adam", loc);
    }
    double beta1, beta2, eps, weight_decay;
    bool decoupled, amsgrad;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> m, v, v_max, skipped;
};
// v = α v + (1-α) g² (centered: minus the square of the mean g kept alike), then
// d = g/(√v + eps) and, with momentum, b = μ b + d, d = b; p -= lr·d; weight_decay adds wd·p
// to g, as PyTorch's
class RMSprop : public Optimizer {
public:
    RMSprop(std::vector<Tensor> params, double lr = 1e-2, double alpha = 0.99, double eps = 1e-8,
            double weight_decay = 0, double momentum = 0, bool centered = false,
            Loc loc = Loc::here());
    RMSprop(const std::vector<ParamGroup>& groups, double lr = 1e-2, double alpha = 0.99,
            double eps = 1e-8, double weight_decay = 0, double momentum = 0,
            bool centered = false, Loc loc = Loc::here())
        : RMSprop(params_of(groups), lr, alpha, eps, weight_decay, momentum, centered, loc) {
        set_groups(groups, lr, "RMSprop", loc);
    }
    double alpha, eps, weight_decay, momentum;
    bool centered;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> square_avg, grad_avg, buffers;
};
// s = s + g², p -= lr_t·g/(√s + eps) with lr_t = lr / (1 + (t - 1)·lr_decay), t the steps
// the parameter had a gradient in, as Adam's; s starts at initial_accumulator_value;
// weight_decay adds wd·p to g, as PyTorch's
class Adagrad : public Optimizer {
public:
    Adagrad(std::vector<Tensor> params, double lr = 1e-2, double lr_decay = 0,
            double weight_decay = 0, double initial_accumulator_value = 0, double eps = 1e-10,
            Loc loc = Loc::here());
    Adagrad(const std::vector<ParamGroup>& groups, double lr = 1e-2, double lr_decay = 0,
            double weight_decay = 0, double initial_accumulator_value = 0, double eps = 1e-10,
            Loc loc = Loc::here())
        : Adagrad(params_of(groups), lr, lr_decay, weight_decay, initial_accumulator_value, eps,
                  loc) {
        set_groups(groups, lr, "Adagrad", loc);
    }
    double lr_decay, weight_decay, eps;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> sums, skipped;
};
// Adam with the infinity norm: m = β1 m + (1-β1) g, u = max(β2 u, |g| + eps), p -= lr·m/u
// / (1 - β1^t); weight_decay adds wd·p to g, as PyTorch's ("exp_avg", "exp_inf")
class Adamax : public Optimizer {
public:
    Adamax(std::vector<Tensor> params, double lr = 2e-3, double beta1 = 0.9,
           double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
           Loc loc = Loc::here());
    Adamax(const std::vector<ParamGroup>& groups, double lr = 2e-3, double beta1 = 0.9,
           double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
           Loc loc = Loc::here())
        : Adamax(params_of(groups), lr, beta1, beta2, eps, weight_decay, loc) {
        set_groups(groups, lr, "Adamax", loc);
    }
    double beta1, beta2, eps, weight_decay;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> m, u, skipped;
};
// Adam with Nesterov's momentum, PyTorch's NAdam: m and v as Adam's, μ_t = β1·(1 -
// 0.96^(t·momentum_decay)/2), and p -= lr·(1 - μ_t)/(1 - Π_{s<=t} μ_s)·g/d +
// lr·μ_{t+1}/(1 - Π_{s<=t+1} μ_s)·m/d with d = √(v/(1 - β2^t)) + eps; weight_decay adds
// wd·p to g ("exp_avg", "exp_avg_sq", "mu_product"). The second product is PyTorch 2's
// (1.13 counted μ_t in it twice).
class NAdam : public Optimizer {
public:
    NAdam(std::vector<Tensor> params, double lr = 2e-3, double beta1 = 0.9,
          double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
          double momentum_decay = 4e-3, Loc loc = Loc::here());
    NAdam(const std::vector<ParamGroup>& groups, double lr = 2e-3, double beta1 = 0.9,
          double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
          double momentum_decay = 4e-3, Loc loc = Loc::here())
        : NAdam(params_of(groups), lr, beta1, beta2, eps, weight_decay, momentum_decay, loc) {
        set_groups(groups, lr, "NAdam", loc);
    }
    double beta1, beta2, eps, weight_decay, momentum_decay;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> m, v, mu_product, skipped;
};
// Rectified Adam, PyTorch's RAdam: m and v as Adam's, ρ∞ = 2/(1 - β2) - 1 and ρ_t = ρ∞ -
// 2t·β2^t/(1 - β2^t); while ρ_t <= 5, p -= lr·m̂ (m̂ = m/(1 - β1^t)); after, p -= lr·m̂·r_t·
// √(1 - β2^t)/(√v + eps), r_t = √((ρ_t - 4)(ρ_t - 2)ρ∞/((ρ∞ - 4)(ρ∞ - 2)ρ_t)). The terms of t
// are computed in float64: 1 - β2^t loses most of a float32's digits early on.
class RAdam : public Optimizer {
public:
    RAdam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9,
          double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
          Loc loc = Loc::here());
    RAdam(const std::vector<ParamGroup>& groups, double lr = 1e-3, double beta1 = 0.9,
          double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0,
          Loc loc = Loc::here())
        : RAdam(params_of(groups), lr, beta1, beta2, eps, weight_decay, loc) {
        set_groups(groups, lr, "RAdam", loc);
    }
    double beta1, beta2, eps, weight_decay;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> m, v, skipped;
};
// s = ρ s + (1-ρ) g², d = √(a + eps)/√(s + eps)·g, a = ρ a + (1-ρ) d², p -= lr·d; weight_decay
// adds wd·p to g, as PyTorch's Adadelta ("square_avg", "acc_delta")
class Adadelta : public Optimizer {
public:
    Adadelta(std::vector<Tensor> params, double lr = 1.0, double rho = 0.9, double eps = 1e-6,
             double weight_decay = 0, Loc loc = Loc::here());
    Adadelta(const std::vector<ParamGroup>& groups, double lr = 1.0, double rho = 0.9,
             double eps = 1e-6, double weight_decay = 0, Loc loc = Loc::here())
        : Adadelta(params_of(groups), lr, rho, eps, weight_decay, loc) {
        set_groups(groups, lr, "Adadelta", loc);
    }
    double rho, eps, weight_decay;
protected:
    std::vector<Tensor> updates() override;
    std::vector<std::vector<std::pair<std::string, Tensor>>> param_state() override;
    std::vector<Tensor> square_avg, acc_delta;
};
// PyTorch's ReduceLROnPlateau: step(metric) after each epoch; once the metric has not improved
// on its best (below best·(1 - threshold), or best - threshold when not relative; above
// best·(1 + threshold) or best + threshold when maximizing) for more than patience steps, the
// rate is multiplied by factor (at least min_lr; a change under eps is skipped) through
// set_lr, and cooldown steps follow in which no step counts as bad. It sets the optimizer's
// lr: a schedule set on the optimizer would override it.
class ReduceLROnPlateau {
public:
    explicit ReduceLROnPlateau(Optimizer& optimizer, bool maximize = false, double factor = 0.1,
                               int64_t patience = 10, double threshold = 1e-4,
                               bool relative_threshold = true, int64_t cooldown = 0,
                               double min_lr = 0, double eps = 1e-8, Loc loc = Loc::here());
    void step(double metric, Loc loc = Loc::here());
    void step(const Tensor& metric, Loc loc = Loc::here()) { step(metric.item(loc), loc); }
    Optimizer& optimizer;
    bool maximize, relative_threshold;
    double factor, threshold, min_lr, eps;
    int64_t patience, cooldown;
    double best;                            // ±∞ until the first step
    int64_t bad_steps = 0, cooldown_left = 0;
};
class AdamW : public Adam {
public:
    AdamW(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
          double eps = 1e-8, double weight_decay = 0.01, bool amsgrad = false,
          Loc loc = Loc::here())
        : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, true, amsgrad, loc) {}
    AdamW(const std::vector<ParamGroup>& groups, double lr = 1e-3, double beta1 = 0.9,
          double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0.01,
          bool amsgrad = false, Loc loc = Loc::here())
        : Adam(groups, lr, beta1, beta2, eps, weight_decay, true, amsgrad, loc) {}
};
}  // namespace optim

// ---- [PARALLEL] data parallelism: one training step over several devices ------ >>parallel
// Seed 000's data parallelism. Each step splits the batch along its first axis over the
// devices (CPU:0, CPU:1, ... or CUDA:0, CUDA:1, ...), runs the forward and backward of every
// shard at once, each on its device's queue, merges the gradients pairwise in a fixed tree and
// updates the parameters once, on the first device, with the optimizer.
//
//   tg::DataParallel step({"CPU:0", "CPU:1"}, opt, [&](const std::vector<Tensor>& shard) {
//       return nn::cross_entropy(model(shard[0]), shard[1]);   // the mean loss of its rows
//   });
//   Tensor loss = step({X, Y});                                 // X, Y: the whole batch
//
// The rule, and so the bits: a batch of n rows over N devices gives the first n mod N devices
// ceil(n/N) rows and the others floor(n/N), in order (n < N is an error). Device k's gradient
// is that of its loss times n_k/n, so their sum is the gradient of the whole batch's mean loss
// (one device's within float rounding). The tree adds device k+1 into k, k+3 into k+2, ...,
// then k+2 into k, ...: ((g0 + g1) + (g2 + g3)) + ...; its last addition is made inside the
// update. The order depends only on N: the same bits on every run and for any TG_THREADS (N
// CPU devices at once use threads()/N threads each).
// The shard's forward and backward (one program per shard size), the merge and the update are
// compiled once, for every device. The loss must not write in place (the optimizer's step runs
// after the merge: do not call it in loss), and every parameter must get a gradient. What the
// loss reads besides its shard (the parameters, a dataset the batch indexes) and a partner's
// gradients are read where they lie by a device that can read that memory (CPU devices), and
// copied to one that cannot (a GPU) at first use and after an in-place update. A failed check
// on any device ends the step before the update: no parameter or optimizer state changes.
class DataParallel {
public:
    // loss(shard) gives the mean loss of one device's rows; the optimizer's parameters live
    // on devices[0]
    using Loss = std::function<Tensor(const std::vector<Tensor>& shard)>;
    DataParallel(std::vector<std::string> devices, optim::Optimizer& optimizer, Loss loss,
                 Loc loc = Loc::here());
    // one step on a batch (every tensor the same number of rows); the loss over the batch
    Tensor operator()(const std::vector<Tensor>& batch, Loc loc = Loc::here());
    // the rows each of `devices` takes of a batch of `rows`
    static std::vector<int64_t> split(int64_t rows, int devices, Loc loc = Loc::here());
    // Across processes (one per GPU; cuda_backend.hpp has NCCL's): called with the first
    // device's merged gradients before the update, it sums them over the processes in place.
    // Each process steps on its part of the global batch, all parts the same size.
    using AllReduce = std::function<void(const std::vector<Tensor>& gradients)>;
    void all_reduce(AllReduce sum_over_processes, int processes);
    struct Times {                       // of the last step, in ms
        std::vector<double> device_ms;   // each device's forward and backward (with its copies)
        double merge_ms = 0;   // from the last device's end to the merged gradients
        double update_ms = 0, step_ms = 0;
    };
    Times last_times() const;
    std::vector<std::string> devices() const;
    struct State;   // the programs and every device's buffers (Part C)
private:
    std::shared_ptr<State> state_;
};

// ---- [DATA] toy datasets and batches ----------------------------------------------------- >>data
namespace data {
struct Dataset { Tensor X, Y; };
// two interleaved half circles (as sklearn's make_moons), X [n,2] float32, Y [n] = -1 or +1
Dataset moons(int64_t n, double noise = 0.1, uint64_t seed = 0, Loc loc = Loc::here());
// a shuffled order of 0..n-1 cut into int32 index tensors of batch_size (a short tail dropped)
std::vector<Tensor> batches(int64_t n, int64_t batch_size, uint64_t seed, Loc loc = Loc::here());
}  // namespace data

// ---- [PLOT] terminal and SVG plots ------------------------------------------------------- >>plot
namespace plot {
using Scorer = std::function<Tensor(const Tensor&)>;   // points [N,2] → scores [N] (> 0: +1)
// regions '.' (score <= 0) and '*' (score > 0), points '#' (label +1) and '+' (label -1)
std::string decision_boundary(const Scorer& score, const Tensor& X, const Tensor& Y,
                              int width = 72, int height = 28, Loc loc = Loc::here());
void decision_boundary_svg(const std::string& path, const Scorer& score, const Tensor& X,
                           const Tensor& Y, int width = 480, int height = 360,
                           Loc loc = Loc::here());
std::string line_chart(const std::vector<double>& values, int width = 72, int height = 12);
}  // namespace plot

// ---- [SAFETENSORS] save and load named tensors ------------------------------------ >>safetensors
// The safetensors format: 8-byte little-endian header size, a JSON header naming each
// tensor's dtype, shape and byte range, then the bytes. float32, float64, int32, int64, bool.
namespace safetensors {
void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          Loc loc = Loc::here());
// throws, returning nothing, on any defect
std::map<std::string, Tensor> load(const std::string& path, Loc loc = Loc::here());
// the same from the bytes of a file in memory; name is what errors call it
std::map<std::string, Tensor> load_bytes(const std::string& bytes,
                                         const std::string& name = "(memory)",
                                         Loc loc = Loc::here());
}  // namespace safetensors

// ---- [DEVICE] where programs run: the seam for backends -------------------------------- >>device
namespace detail {
// The loop IR ([LOOPIR] in Part C lowers kernels into it, [PASSES] rewrite it, renderers and
// the interpreter read it): declared here so that a backend in a second header can render it.
struct Node;
enum class EK : uint8_t { CONST, VAR, ACC, LOAD, ALU, CHECK };
struct Expr;
using ExprP = std::shared_ptr<const Expr>;
struct Expr {
    EK kind;
    Op op = Op::CONST;     // ALU: which op
    DType dtype;
    double num = 0;        // CONST: the value
    int id = 0;            // VAR: variable, ACC: accumulator, LOAD: buffer, CHECK: site
    int64_t bound = 0;     // CHECK: valid indices are [0, bound)
    std::vector<ExprP> src;
};

enum class SK : uint8_t { LOOP, ACC_INIT, ACC_UPDATE, STORE, STORE_ADD, CHECK };
struct Stmt {
    SK kind;
    int id = 0;             // LOOP: variable (its extent is in Block::extents), ACC_*:
                            // accumulator, STORE: buffer
    Op op = Op::REDUCE_SUM; // ACC_* and STORE_ADD: REDUCE_SUM or REDUCE_MAX
    DType dtype = DType::FLOAT32;
    ExprP idx, val;         // STORE: buffer[idx] = val; STORE_ADD: buffer[idx] op= val (op
                            // REDUCE_SUM: +=, REDUCE_MAX: max=: scatters);
                            // ACC_UPDATE: acc op= val;
                            // CHECK: idx is a bounds check whose value nothing reads
    std::vector<Stmt> body; // LOOP
};
struct Block {
    std::string title;      // e.g. "K0 float32 [64,16]: REDUCE_SUM MUL ADD MAX"
    std::string origin;     // user lines whose ops this block computes
    std::vector<Stmt> body;
    // loop variable i runs over [0, extents[i]): the one place a pass edits to split or
    // resize a loop; expressions and LOOP statements name variables by number only
    std::vector<int64_t> extents;
    bool writes_in_place = false;   // an assignment: runs only if no bounds check failed so far
    // TG_CHECK: after the block, buffer finite_buffer (numel finite_count) must hold no NaN or
    // infinity; finite_site is its check site
    int finite_site = -1, finite_buffer = -1;
    int64_t finite_count = 0;
    // > 0: the body is one loop whose iterations write disjoint parts (parallel_loops); its
    // range is cut into this many chunks, which may run on different threads
    int64_t parallel_chunks = 0;
    // rows > 0 (tile_products): a matrix product rendered as register tiles of rows × cols
    // sums over packed operands, the columns in panels of panel_cols and the rows in blocks
    // of row_block; its tasks (other output loops × panels × row blocks) are what the
    // parallel chunks cut; piece_terms > 0: a sum too long for one panel is packed and
    // summed a piece of at most that many terms at a time (tree_pieces)
    struct Tiles {
        int rows = 0, cols = 0;
        int64_t panel_cols = 0, row_block = 0, tasks = 0, piece_terms = 0;
    };
    Tiles tile;
};

struct ProgramBuffer {
    enum Role : uint8_t { INPUT, OUTPUT, TEMP } role;
    DType dtype;
    int64_t numel;
    int64_t offset = -1;   // TEMP: where it lies in the program's arena (plan_memory); -1: alone
    // TEMP used by one block only (local_temps): an array of numel declared in the body of
    // loop local_loop of block local_block (-1: in the block's function), not in memory
    int local_block = -1, local_loop = -1;
};

struct Program {
    std::string name;                    // readable: where the user built the last kernel
    std::vector<ProgramBuffer> buffers;  // buffer i is argument i of the compiled function
    std::vector<Node*> buffer_nodes;     // the node that owns buffer i's storage, as lowered
                                         // (then ProgramRun::owners: programs are reused)
    std::vector<Block> blocks;
    struct Check {
        std::string what;     // what it guards
        Loc loc;              // the user's line
        bool finite = false;  // TG_CHECK's test of a kernel's values, not an index's bounds
    };
    std::vector<Check> checks;
    std::vector<std::pair<int, Loc>> updates;   // buffers written in place, and by which line
    int64_t arena_bytes = 0;   // one allocation that the planned temporaries share
    int64_t work = 0;          // statements run, loops counted (set by run_passes)
};

// A prepared program: compiled (CPU), or kept for interpretation (INTERP). run() fills the
// output buffers; err[0] is set to 1+site of a failed bounds check, err[1] the bad index.
struct Executable {
    virtual ~Executable() = default;
    virtual void run(void* const* buffers, int64_t* err) = 0;
    // what Device::prepare_files left to the first run (a compile), done before it is timed
    virtual bool needs_build() { return false; }
    virtual void build() {}
};
// A device's queue, its stream: work runs in order, apart from the thread that queues it
// (CPU and CUDA devices: on the queue's own thread, [RUNTIME]). An event is the number of
// items queued so far; waiting for it waits for them. Work that throws keeps its error, the
// work after it is dropped, and the next wait or synchronize throws it.
struct WorkQueue {
    virtual ~WorkQueue() = default;
    virtual uint64_t enqueue(std::function<void()> work) = 0;   // gives the event after it
    virtual uint64_t record() = 0;                              // the event now
    virtual void wait(uint64_t event) = 0;
    void synchronize() { wait(record()); }
};
struct Device {
    virtual ~Device() = default;
    virtual const char* name() const = 0;
    virtual void* alloc(size_t bytes) = 0;
    virtual void free(void* ptr) = 0;
    virtual void copy_in(void* dst, const void* host_src, size_t bytes) = 0;
    virtual void copy_out(void* host_dst, const void* src, size_t bytes) = 0;
    // bytes from src (this device's) to dst on the device `to`, without a stop in host memory
    // where the two can (host memory: one memcpy; CUDA: a peer copy); otherwise through it
    virtual void copy_to(Device& to, void* dst, const void* src, size_t bytes);
    virtual bool host_memory() const { return false; }   // its pointers are host addresses
    // an optimizer's step may run on its queue while the caller goes on (TG_SYNC)
    virtual bool runs_in_background() const { return false; }
    // where its asynchronous work runs in order (DataParallel's steps, copies between
    // devices); made at first use
    WorkQueue& queue();
    virtual std::shared_ptr<Executable> prepare(const Program& program) = 0;
    // Where its programs are C files (CPU): a program's files, and the program prepared from
    // them, so that one read from disk by its graph's structure is not rendered again
    // (save_lowered). later: its compile left to its first run, which a setup program runs on
    // the device's queue while the host goes on (RunMode). Empty, null: not such a device.
    virtual std::vector<std::string> source_files(const Program&) { return {}; }
    virtual std::shared_ptr<Executable> prepare_files(const Program&, std::vector<std::string>,
                                                      bool /*later*/) {
        return nullptr;
    }
    // the source prepare() compiles, for TG_DEBUG (kept as NAME-HASH + source_suffix())
    virtual std::string source(const Program&) { return ""; }
    virtual const char* source_suffix() const { return ".c"; }
    // the passes of TG_PASSES that suit it (CUDA: not the CPU's fusion into row loops, but
    // fuse_maps, which only a device without fuse_loops needs)
    virtual bool runs_pass(const std::string& pass) const { return pass != "fuse_maps"; }
    // whether a value with calls (exp2, a select) that several kernels read may be computed in
    // each of them rather than stored once (the scheduler's cost model): not on the CPU, where
    // such calls in a matrix product's epilogue keep GCC from vectorizing the product
    virtual bool recomputes_calls() const { return false; }
    // run at the start of its queue's thread (CPU:k: the thread pool its programs use there)
    virtual void queue_thread_start() {}
    // the settings (environment variables) its programs depend on beyond the graph, part of
    // the key under which a program is reused (CPU: TG_CC, TG_CFLAGS)
    virtual std::string settings() const { return ""; }

private:
    std::shared_ptr<WorkQueue> queue_;
    std::once_flag queue_made_;
};
// "CPU", "INTERP", a registered one, or one of several of a kind: "CPU:1" (made at first use,
// with its own memory, queue and threads); "CPU:0" is "CPU" and "CUDA:0" is "CUDA"
Device& device(const std::string& name);
void register_device(const std::string& name, Device* device);
// makes KIND:k for k >= 1 when first named (the CPU's is built in; cuda_backend.hpp adds CUDA's)
void register_device_kind(const std::string& kind, std::function<Device*(int index)> make);
Device& default_device();                              // $TG_DEVICE, else CPU
// Called with every program the pipeline builds, after its passes, before its device prepares
// it (tests use it to render each program of a run for a second backend); not for one found
// by its graph's structure, in memory or on disk. Empty by default.
std::function<void(const Program&)>& program_observer();
}  // namespace detail

}  // namespace tg

// auto [values, indices] = x.max(1) unpacks a tg::ValuesIndices
namespace std {
template <> struct tuple_size<tg::ValuesIndices> : integral_constant<size_t, 2> {};
template <size_t I> struct tuple_element<I, tg::ValuesIndices> { using type = tg::Tensor; };
}  // namespace std

#endif  // TINYGRAD_HPP_INCLUDED

/* =============================================================================================
   Part C: the implementation, in pipeline order
   ============================================================================================= */
#if defined(TINYGRAD_IMPLEMENTATION) && !defined(TINYGRAD_IMPLEMENTATION_DONE)
#define TINYGRAD_IMPLEMENTATION_DONE

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <mutex>
#include <condition_variable>
#include <sstream>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <deque>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

// Build time: at -O2 the compiler spends most of this file's time optimizing Part C, and much
// of Part C runs once per new program, beside a C compiler call that takes far longer: the
// scheduler, lowering, most passes, the C renderer, the compiler driver, and plots and
// safetensors files. Those sections are compiled unoptimized (TG_COLD_BEGIN to TG_COLD_END):
// the implementation compiles in 14-20% less time and the pipeline runs about 6% longer. What
// runs every step (graph building, autograd, realize, replay, the interpreter, the thread pool)
// and the IR walks the passes spend their time in keep the includer's level (a walk's lambda
// left unoptimized would be called, not inlined, at every node). TINYGRAD_OPTIMIZE_ALL, or
// -Os (unoptimized code is larger), optimizes every section. Figures: README.md, Build time.
#if defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__) && !defined(TINYGRAD_OPTIMIZE_ALL)
#if defined(__clang__)
#define TG_COLD_BEGIN _Pragma("clang optimize off")
#define TG_COLD_END _Pragma("clang optimize on")
#elif defined(__GNUC__)
#define TG_COLD_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O0\")")
#define TG_COLD_END _Pragma("GCC pop_options")
#endif
#endif
#ifndef TG_COLD_BEGIN
#define TG_COLD_BEGIN
#define TG_COLD_END
#endif

namespace tg {
namespace detail {

// ---- [UTIL] strings, errors, environment, hashing, files --------------------------------- >>util
// Small helpers used by every later section. Files are written to a temporary name and
// renamed, so a crash never leaves half a file under the real name.

static std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string strf(const char* fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out(size_t(n > 0 ? n : 0), '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

static std::string loc_str(Loc loc) {
    if (!loc.file) return "?";
    const char* base = std::strrchr(loc.file, '/');
    return strf("%s:%d", base ? base + 1 : loc.file, loc.line);
}

// Where the user called the library function that is running: nodes that the library builds
// for itself (inside nn, optim, backward, or through an operator) are attributed to that line.
static thread_local Loc user_loc;
static bool is_library_loc(Loc l) {   // this file, however the includer spelled its path
    if (!l.file) return true;
    const char* base = std::strrchr(l.file, '/');
    return std::strcmp(base ? base + 1 : l.file, "tinygrad.hpp") == 0;
}
struct UserLocScope {
    Loc saved;
    explicit UserLocScope(Loc l) : saved(user_loc) {
        if (!is_library_loc(l)) user_loc = l;
    }
    ~UserLocScope() { user_loc = saved; }
};

// Errors name the user's line; a location inside the library is replaced by the caller's.
[[noreturn]] static void fail(const std::string& msg, Loc loc = {}) {
    if (is_library_loc(loc)) loc = user_loc;
    throw Error(loc.file ? msg + " (at " + loc_str(loc) + ")" : msg);
}

static std::string env_str(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}
// This process's id: getpid() is a system call at each use (glibc keeps no copy; a few µs on
// a virtual machine), and each eager step asks several times. Forgotten in a child at fork().
static pid_t this_process() {
    static std::atomic<pid_t> pid{0};
    static const int forget_at_fork =
        pthread_atfork(nullptr, nullptr, [] { pid.store(0, std::memory_order_relaxed); });
    (void)forget_at_fork;
    pid_t p = pid.load(std::memory_order_relaxed);
    if (p == 0) pid.store(p = getpid(), std::memory_order_relaxed);
    return p;
}
// A whole number from the environment; anything else is an error, not a silent default.
static int env_int(const char* name, int fallback, int lo, int hi) {
    std::string v = env_str(name, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (*end || n < lo || n > hi)
        fail(strf("%s must be a whole number from %d to %d, got '%s'", name, lo, hi, v.c_str()));
    return int(n);
}
static int debug_level() { return env_int("TG_DEBUG", 0, 0, 4); }

// FNV-1a. It hashes a byte at a time, so pieces hashed one after another, each from the
// last's value, hash as their concatenation would: keys are hashed from their parts without
// copying them into one string (fresh memory costs a page fault per 4 KB, dear on a VM).
static const uint64_t FNV_START = 1469598103934665603ull;
static uint64_t fnv1a64(const char* data, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)data[i]) * 1099511628211ull;
    return h;
}
static uint64_t fnv1a64(const std::string& data, uint64_t h = FNV_START) {
    return fnv1a64(data.data(), data.size(), h);
}
// the hash of the parts joined with '\0' between them
static uint64_t fnv1a64_joined(std::initializer_list<const std::string*> parts) {
    uint64_t h = FNV_START;
    bool first = true;
    for (const std::string* part : parts) {
        if (!first) h = fnv1a64("", 1, h);
        h = fnv1a64(*part, h);
        first = false;
    }
    return h;
}
static std::string hex16(uint64_t h) { return strf("%016llx", (unsigned long long)h); }

// The file's bytes, read into a string of its size at once (a file of unknown size, as
// /proc's, in pieces).
static bool read_file(const std::string& path, std::string& out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    out.clear();
    bool sized = fstat(fd, &st) == 0 && st.st_size > 0;
    if (sized) out.reserve(size_t(st.st_size) + 1);   // + 1: the read that finds the end
    bool ok = true;
    for (;;) {
        size_t at = out.size(), room = out.capacity() - at;
        size_t want = room > 0 && (sized || room >= 1024) ? room : std::max<size_t>(at, 4096);
        out.resize(at + want);
        ssize_t n = ::read(fd, &out[at], want);
        if (n < 0 && errno == EINTR) n = 0;
        else if (n <= 0) {
            ok = n == 0;
            out.resize(at);
            break;
        }
        out.resize(at + size_t(n));
    }
    ::close(fd);
    return ok;
}

static void write_file_atomic(const std::string& path, const std::string& data) {
    static std::atomic<int> counter{0};
    std::string tmp = strf("%s.tmp.%d.%d", path.c_str(), int(getpid()), counter++);
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("cannot write " + path + ": " + std::strerror(errno));
    bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        int why = errno;
        std::remove(tmp.c_str());
        fail("cannot write " + path + ": " + std::strerror(why));
    }
}

// The compile cache holds code that this process loads and runs, so it must be private:
// $TG_CACHE_DIR, else $XDG_CACHE_HOME/tinygrad, else $HOME/.cache/tinygrad (the home directory
// from the password database when HOME is unset; never a shared directory). Missing
// directories are created 0700. A cache directory owned by another user, writable by group or
// others, or reached through a symbolic link owned by another user is refused, saying how to
// fix it. Tests: tests/test_runtime.cpp.
static std::string cache_dir() {
    std::string dir = env_str("TG_CACHE_DIR", "");
    if (dir.empty()) {
        std::string base = env_str("XDG_CACHE_HOME", "");
        if (base.empty()) {
            std::string home = env_str("HOME", "");
            if (home.empty())
                if (const passwd* pw = getpwuid(geteuid())) home = pw->pw_dir ? pw->pw_dir : "";
            if (home.empty())
                fail("compile cache: HOME is not set and this user has no home directory; set "
                     "TG_CACHE_DIR to a private directory");
            base = home + "/.cache";
        }
        dir = base + "/tinygrad";
    }
    uid_t me = geteuid();
    const char* fix = "the cache holds code that this process loads: set TG_CACHE_DIR to a "
                      "directory of your own";
    struct stat st;
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        std::string part = dir.substr(0, i);
        if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
            fail("cannot create cache directory " + part + ": " + std::strerror(errno));
        if (lstat(part.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && st.st_uid != me &&
            st.st_uid != 0)
            fail(strf("compile cache %s is reached through %s, a symbolic link owned by another "
                      "user (uid %d); %s", dir.c_str(), part.c_str(), int(st.st_uid), fix));
    }
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        fail("cache directory " + dir + " is not a directory");
    if (st.st_uid != me)
        fail(strf("compile cache %s is owned by another user (uid %d); %s", dir.c_str(),
                  int(st.st_uid), fix));
    if (st.st_mode & 022)
        fail(strf("compile cache %s is writable by %s (mode %03o), and it holds code that this "
                  "process loads: chmod go-w %s, or set TG_CACHE_DIR to a private directory",
                  dir.c_str(), st.st_mode & 002 ? "everyone" : "its group",
                  unsigned(st.st_mode & 0777), dir.c_str()));
    return dir;
}

static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

// ---- [SHAPES] dtypes, values, shapes, broadcasting, axes ------------------------------- >>shapes
// Shape rules in one place: every error names the op and the shapes involved. And the meaning
// of every arithmetic op on values (alu_eval): the interpreter, the constant folders of the
// graph and of the loop IR use it, and the C renderer emits the same semantics.

const char* dtype_name(DType dt) {
    switch (dt) {
    case DType::BOOL: return "bool";
    case DType::INT32: return "int32";
    case DType::INT64: return "int64";
    case DType::FLOAT32: return "float32";
    case DType::FLOAT64: return "float64";
    case DType::INDEX: return "index";
    }
    return "?";
}
size_t dtype_size(DType dt) {
    switch (dt) {
    case DType::BOOL: return 1;
    case DType::INT32: case DType::FLOAT32: return 4;
    case DType::INT64: case DType::FLOAT64: case DType::INDEX: return 8;
    }
    return 0;
}
bool dtype_is_float(DType dt) { return dt == DType::FLOAT32 || dt == DType::FLOAT64; }

std::string shape_str(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + "]";
}

const char* op_name(Op op) {
    static const char* names[] = {
#define TG_OP_NAME(name, kind, c) #name,
        TG_OPS(TG_OP_NAME)
#undef TG_OP_NAME
    };
    return names[int(op)];
}
OpKind op_kind(Op op) {
    static const OpKind kinds[] = {
#define TG_OP_KIND(name, kind, c) OpKind::kind,
        TG_OPS(TG_OP_KIND)
#undef TG_OP_KIND
    };
    return kinds[int(op)];
}

namespace detail {

static const char* op_c_form(Op op) {
    static const char* forms[] = {
#define TG_OP_C(name, kind, c) c,
        TG_OPS(TG_OP_C)
#undef TG_OP_C
    };
    return forms[int(op)];
}

static int64_t shape_numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

static Shape contiguous_strides(const Shape& s) {
    Shape st(s.size());
    int64_t acc = 1;
    for (size_t i = s.size(); i-- > 0;) { st[i] = acc; acc *= s[i]; }
    return st;
}

// Negative axes count from the end. A 0-d tensor takes axis 0 or -1 where PyTorch allows it
// (reductions, softmax, flip, transpose): scalar_ok; ops that index the shape do not.
static int normalize_axis(int axis, size_t ndim, const char* op, const Shape& shape, Loc loc,
                          bool scalar_ok = true) {
    int n = int(ndim), limit = scalar_ok ? std::max(n, 1) : n;
    if (axis < -limit || axis >= limit)
        fail(strf("%s: axis %d out of range for shape %s", op, axis, shape_str(shape).c_str()),
             loc);
    return axis < 0 ? axis + limit : axis;
}

static std::vector<int> normalize_axes(const std::vector<int>& axes, const Shape& shape,
                                       const char* op, Loc loc) {
    std::vector<int> out;
    for (int a : axes) {
        int ax = normalize_axis(a, shape.size(), op, shape, loc);
        if (std::find(out.begin(), out.end(), ax) != out.end())
            fail(strf("%s: axis %d repeated for shape %s", op, a, shape_str(shape).c_str()), loc);
        out.push_back(ax);
    }
    return out;
}

// NumPy broadcasting: align on the right; each pair of sizes is equal or one of them is 1.
static Shape broadcast_shape(const Shape& a, const Shape& b, const char* op, Loc loc) {
    size_t n = std::max(a.size(), b.size());
    Shape out(n);
    for (size_t i = 0; i < n; i++) {
        int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
        int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
        if (da != db && da != 1 && db != 1)
            fail(strf("%s: shapes %s and %s cannot broadcast", op, shape_str(a).c_str(),
                      shape_str(b).c_str()), loc);
        out[i] = da == 1 ? db : da;
    }
    return out;
}
// whether from broadcasts to the shape to, leaving it unchanged (an expand's rule)
static bool broadcasts_to(const Shape& from, const Shape& to) {
    if (from.size() > to.size()) return false;
    for (size_t i = 1; i <= from.size(); i++)
        if (from[from.size() - i] != 1 && from[from.size() - i] != to[to.size() - i]) return false;
    return true;
}

// Sizes are non-negative, and the product of the nonzero ones (the element count, the largest
// stride of a view) fits in an int64: [0, 2^32, 2^32] is refused too.
static void check_shape(const Shape& s, const char* op, Loc loc) {
    int64_t n = 1;
    for (int64_t d : s) {
        if (d < 0) fail(strf("%s: negative size in %s", op, shape_str(s).c_str()), loc);
        if (d != 0 && __builtin_mul_overflow(n, d, &n))
            fail(strf("%s: shape %s is too large: its sizes multiply past 2^63", op,
                      shape_str(s).c_str()), loc);
    }
}

static DType promote(DType a, DType b) { return std::max(a, b); }

// Integer arithmetic wraps around (the C computes it in unsigned types), as in PyTorch; a
// float cast to an integer saturates at the ends of its range, and NaN becomes 0 (in C the
// conversion of an out-of-range float is undefined).
static int64_t wrap_int(DType dt, uint64_t v) {
    if (dt == DType::BOOL) return v != 0;
    if (dt == DType::INT32) return int32_t(uint32_t(v));
    return int64_t(v);
}
static int64_t saturate_int(DType dt, double v) {
    if (dt == DType::BOOL) return v != 0;   // NaN too, as C's and PyTorch's casts
    if (std::isnan(v)) return 0;
    double lo = dt == DType::INT32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dt == DType::INT32 ? 2147483648.0 : 9223372036854775808.0;   // exclusive
    if (v <= lo) return dt == DType::INT32 ? INT32_MIN : INT64_MIN;
    if (v >= hi) return dt == DType::INT32 ? INT32_MAX : INT64_MAX;
    return int64_t(v);
}

// -- the meaning of every arithmetic op. A value is held as the interpreter and the constant
// folder hold it: floats in f (float32 rounded to float after every op, as C computes them),
// integers of every width exactly in i.
struct Num {
    double f = 0;
    int64_t i = 0;
};
static Num num_of(double v, DType dt) {   // a constant (Expr::num) as a value
    Num n;
    if (dtype_is_float(dt)) n.f = dt == DType::FLOAT32 ? double(float(v)) : v;
    else n.i = saturate_int(dt == DType::INT32 ? DType::INT32 : DType::INT64, v);
    return n;
}
static double num_double(Num n, DType dt) { return dtype_is_float(dt) ? n.f : double(n.i); }

// Counter-based uniform [0,1): two rounds of a 32-bit integer hash of (seed, index). The same
// text is compiled here (interpreter, constant folding) and emitted into every C program, so
// all devices draw identical numbers. The constant added first keeps (0, 0), a fresh process's
// first draw, from hashing to 0 through both rounds (its first rand was 0, its first randn 0).
#define TG_RAND_SOURCE                                                                         \
    static inline float tg_rand(uint32_t seed, uint32_t i) {                                   \
        uint32_t x = (i * 0x9E3779B9u ^ seed) + 0x6A09E667u;                                   \
        x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;          \
        x ^= seed * 0x85EBCA6Bu;                                                               \
        x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;          \
        return (float)(x >> 8) * (1.0f / 16777216.0f);                                         \
    }
TG_RAND_SOURCE
// 2^x and log2 x for float32, in arithmetic the C compiler vectorizes (a libm call keeps a
// whole loop scalar) and with the same text here (interpreter, constant folding) as in every
// C program. Selects are bit masks, as in tg_wheref. exp2: x = n + f with n an integer and
// |f| <= 1/2, 2^f by its Taylor polynomial of degree 7 (truncation below 1e-8), 2^n as two
// exponent-field factors so that n from -150 to 128 needs no case of its own.
#define TG_EXP2F_SOURCE                                                                        \
    static inline float tg_exp2f(float x) {                                                    \
        union { float f; uint32_t u; } v = {x}, a, b, r;                                       \
        uint32_t big = -(uint32_t)(x > 128.0f), small = -(uint32_t)(x < -150.0f);              \
        uint32_t nan = -(uint32_t)(x != x);                                                    \
        v.u = (v.u & ~(big | small | nan)) | (0x43000000u & big) | (0xC3160000u & small);      \
        float n = (v.f + 12582912.0f) - 12582912.0f, f = v.f - n;                              \
        float p = 1.525273380e-05f;                                                            \
        p = p * f + 1.540353039e-04f;                                                          \
        p = p * f + 1.333355815e-03f;                                                          \
        p = p * f + 9.618129108e-03f;                                                          \
        p = p * f + 5.550410866e-02f;                                                          \
        p = p * f + 2.402265070e-01f;                                                          \
        p = p * f + 6.931471806e-01f;                                                          \
        p = p * f + 1.0f;                                                                      \
        int32_t k = (int32_t)n, k1 = k / 2;                                                    \
        a.u = (uint32_t)(k1 + 127) << 23;                                                      \
        b.u = (uint32_t)(k - k1 + 127) << 23;                                                  \
        r.f = p * a.f * b.f;                                                                   \
        r.u = (r.u & ~nan) | (0x7FC00000u & nan);                                              \
        return r.f;                                                                            \
    }
// log2: x = 2^e·m with m in [√½, √2) (subnormals scaled by 2^23 first), log2 m = 2/ln2 ·
// atanh(s) with s = (m-1)/(m+1), |s| < 0.172, by the series to s^9 (truncation below 3e-9),
// in double so that the float result is rounded once.
#define TG_LOG2F_SOURCE                                                                        \
    static inline float tg_log2f(float x) {                                                    \
        union { float f; uint32_t u; } v = {x}, scaled = {x * 8388608.0f}, m, r;               \
        uint32_t sub = -(uint32_t)(x < 1.17549435e-38f);                                       \
        v.u = (v.u & ~sub) | (scaled.u & sub);                                                 \
        int32_t e = (int32_t)((v.u >> 23) & 255u) - 127 - (int32_t)(sub & 23u);                \
        m.u = (v.u & 0x007FFFFFu) | 0x3F800000u;                                               \
        uint32_t high = -(uint32_t)(m.f > 1.41421356f);                                        \
        m.u -= high & 0x00800000u;                                                             \
        e += (int32_t)(high & 1u);                                                             \
        double s = ((double)m.f - 1.0) / ((double)m.f + 1.0), s2 = s * s;                      \
        double q = 0.3205988979753252;                                                         \
        q = q * s2 + 0.41219858311113239;                                                      \
        q = q * s2 + 0.57707801635558531;                                                      \
        q = q * s2 + 0.96179669392597555;                                                      \
        q = q * s2 + 2.8853900817779268;                                                       \
        r.f = (float)((double)e + s * q);                                                      \
        uint32_t zero = -(uint32_t)(x == 0.0f), inf = -(uint32_t)(x > 3.40282347e+38f);       \
        uint32_t nan = -(uint32_t)(!(x >= 0.0f));                                              \
        r.u = (r.u & ~(zero | inf | nan)) | (0xFF800000u & zero) | (0x7F800000u & inf) |       \
              (0x7FC00000u & nan);                                                             \
        return r.f;                                                                            \
    }
TG_EXP2F_SOURCE
TG_LOG2F_SOURCE
#define TG_STRINGIFY2(...) #__VA_ARGS__
#define TG_STRINGIFY(...) TG_STRINGIFY2(__VA_ARGS__)

static Num cast_num(Num a, DType from, DType to) {
    Num r;
    if (to == DType::FLOAT32) r.f = dtype_is_float(from) ? double(float(a.f)) : double(float(a.i));
    else if (to == DType::FLOAT64) r.f = dtype_is_float(from) ? a.f : double(a.i);
    else if (dtype_is_float(from)) r.i = saturate_int(to == DType::INDEX ? DType::INT64 : to, a.f);
    else r.i = wrap_int(to, uint64_t(a.i));
    return r;
}

// in: the operands' dtype (a comparison's or a cast's operand differs from its result)
static Num alu_eval(Op op, DType dt, DType in, const Num* a) {
    Num r;
    switch (op) {
    case Op::CMPLT: r.i = dtype_is_float(in) ? a[0].f < a[1].f : a[0].i < a[1].i; return r;
    case Op::CMPEQ: r.i = dtype_is_float(in) ? a[0].f == a[1].f : a[0].i == a[1].i; return r;
    case Op::WHERE: return a[0].i ? a[1] : a[2];
    case Op::CAST: return cast_num(a[0], in, dt);
    case Op::RAND: r.f = tg_rand(uint32_t(a[0].i), uint32_t(a[1].i)); return r;
    default: break;
    }
    if (!dtype_is_float(dt)) {
        uint64_t x = uint64_t(a[0].i), y = uint64_t(a[1].i);
        int64_t sx = a[0].i, sy = a[1].i;
        switch (op) {
        case Op::NEG: r.i = wrap_int(dt, 0 - x); return r;
        case Op::ADD: r.i = dt == DType::BOOL ? (x | y) != 0 : wrap_int(dt, x + y); return r;
        case Op::MUL: r.i = dt == DType::BOOL ? (x & y) != 0 : wrap_int(dt, x * y); return r;
        case Op::MAX: r.i = std::max(sx, sy); return r;
        case Op::DIV:   // truncating like C; x / 0 = 0 and MIN / -1 wraps, where C traps
            r.i = sy == 0 ? 0 : sy == -1 ? wrap_int(dt, 0 - x) : sx / sy;
            return r;
        case Op::MOD: r.i = sy == 0 || sy == -1 ? 0 : sx % sy; return r;
        default: break;
        }
    } else {
        bool f32 = dt == DType::FLOAT32;
        double x = a[0].f, y = a[1].f;
        switch (op) {
        case Op::NEG: r.f = -x; return r;
        case Op::EXP2: r.f = f32 ? tg_exp2f(float(x)) : std::exp2(x); return r;
        case Op::LOG2: r.f = f32 ? tg_log2f(float(x)) : std::log2(x); return r;
        case Op::SIN: r.f = f32 ? std::sin(float(x)) : std::sin(x); return r;
        case Op::COS: r.f = f32 ? std::cos(float(x)) : std::cos(x); return r;
        case Op::SQRT: r.f = f32 ? std::sqrt(float(x)) : std::sqrt(x); return r;
        case Op::RECIP: r.f = f32 ? 1.0f / float(x) : 1.0 / x; return r;
        case Op::DIV: r.f = f32 ? double(float(x) / float(y)) : x / y; return r;
        case Op::ADD: r.f = f32 ? double(float(x) + float(y)) : x + y; return r;
        case Op::MUL: r.f = f32 ? double(float(x) * float(y)) : x * y; return r;
        case Op::MAX: r.f = std::isnan(x) || x > y ? x : y; return r;
        default: break;
        }
    }
    fail(strf("alu_eval: %s is not an arithmetic op for %s", op_name(op), dtype_name(dt)));
}

// ---- [GRAPH] nodes, buffers and the primitive builders ---------------------------------- >>graph
// A Node is one primitive op with its inferred shape and dtype. Builders here check their
// arguments and infer the result, so every later stage can trust shapes. A realized node
// becomes a BUFFER node holding its data; its sources are released.

// In-place updates are counted: a lazy node remembers the count when it was built, and a
// buffer the count of the update that last wrote it. A node that reads a buffer written after
// it was built would see a value that did not exist when it was built (PyTorch computes it
// at once): realizing it is an error (check_fresh).
static std::atomic<uint64_t> update_count{0};
static std::atomic<uint64_t> buffers_made{0};

// How a program that runs in the background ended ([REALIZE]): its error, thrown by every
// read of what it made
struct RunOutcome {
    std::exception_ptr error;
    bool inherited = false;            // an earlier program's error: not reported again
    std::atomic<bool> failed{false};   // set after error, by the queue's thread
    void fail_with(std::exception_ptr e, bool from_earlier = false) {
        error = std::move(e);
        inherited = from_earlier;
        failed.store(true, std::memory_order_release);
    }
    void rethrow_if_failed() const {
        if (failed.load(std::memory_order_acquire)) std::rethrow_exception(error);
    }
};

struct Buffer {
    Device* device;
    void* ptr;
    DType dtype;
    int64_t numel;
    uint64_t written_at = 0;   // the in-place update (update_count) that last wrote it
    Loc written_by;            // and where the user asked for it
    std::shared_ptr<Buffer> arena;   // set: this buffer is a part of arena's memory
    uint64_t made = ++buffers_made;  // a program in the background started before it cannot use it
    std::shared_ptr<RunOutcome> made_by;   // the background program that computes it, if any
    bool moved = false;   // its tensor moved to another device (Module::to): stale for programs
    Buffer(Device* dev, DType dt, int64_t n)
        : device(dev), ptr(dev->alloc(size_t(std::max<int64_t>(n, 1)) * dtype_size(dt))),
          dtype(dt), numel(n) {}
    Buffer(std::shared_ptr<Buffer> in, int64_t offset, DType dt, int64_t n)
        : device(in->device), ptr(static_cast<char*>(in->ptr) + offset), dtype(dt), numel(n),
          arena(std::move(in)) {}
    ~Buffer() {
        if (!arena) device->free(ptr);
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    size_t bytes() const { return size_t(numel) * dtype_size(dtype); }
};

static std::shared_ptr<Buffer> copy_buffer(const Buffer& b, Device* to = nullptr);   // [JIT]

// Which part of a training step built a node; the generated C says it beside each kernel.
enum class Phase : uint8_t { FORWARD, BACKWARD, UPDATE };
static const char* phase_name(Phase p) {
    return p == Phase::FORWARD ? "forward" : p == Phase::BACKWARD ? "backward" : "update";
}
static thread_local Phase current_phase = Phase::FORWARD;
static thread_local int no_grad_depth = 0;
struct PhaseScope {
    Phase saved;
    explicit PhaseScope(Phase p) : saved(current_phase) { current_phase = p; }
    ~PhaseScope() { current_phase = saved; }
};

struct Node : std::enable_shared_from_this<Node> {
    Op op;
    DType dtype;
    Shape shape;
    std::vector<std::shared_ptr<Node>> src;
    std::vector<int64_t> arg;         // axes, a new shape, or (begin,end) pairs, per op
    double value = 0;                 // CONST's value, RAND's seed
    std::shared_ptr<Buffer> buffer;   // set once realized (BUFFER nodes have it from the start)
    Device* device = nullptr;         // where it is computed (node_device); null: a constant
    Loc loc;
    Phase phase = Phase::FORWARD;
    bool requires_grad = false;       // float nodes that depend on a leaf that requires grad
    bool leaf = false;                // requires_grad() was called on it: backward() fills grad
    uint64_t built_at = update_count; // the in-place updates done before it was built
    std::shared_ptr<Node> grad;       // a leaf's accumulated gradient
    // Releasing the last handle of a long chain would free it recursively, one stack frame
    // per node; the nodes that die with this one are released here in a loop instead.
    ~Node() {
        std::vector<std::shared_ptr<Node>> dying = std::move(src);
        if (grad) dying.push_back(std::move(grad));
        while (!dying.empty()) {
            std::shared_ptr<Node> n = std::move(dying.back());
            dying.pop_back();
            if (n.use_count() != 1) continue;
            for (auto& s : n->src) dying.push_back(std::move(s));
            n->src.clear();
            if (n->grad) dying.push_back(std::move(n->grad));
        }
    }
};
using NodeP = std::shared_ptr<Node>;

// Nodes to realize with the next program: backward() puts the loss and the gradients here,
// so an optimizer step computes them with the parameters before the update (as PyTorch would
// have them) and in the same program.
//
// A pending gradient's graph usually reads its own leaf (the weight's gradient of x·W·W reads
// W), and the leaf holds the gradient: a cycle that reference counting never frees. Realizing
// the gradient cuts it (a result keeps its buffer, not its graph), but a thread may end first
// (a program that exits after backward()). Its end then cuts the cycles nothing outside holds.
struct PendingGradients {
    std::vector<NodeP> targets;
    std::vector<std::weak_ptr<Node>> leaves;   // whose grad was pending when noted
    PendingGradients() = default;
    PendingGradients(const PendingGradients&) = delete;
    PendingGradients& operator=(const PendingGradients&) = delete;
    ~PendingGradients();
    void forget_realized() {   // after a program: keep the leaves whose grad is still pending
        leaves.erase(std::remove_if(leaves.begin(), leaves.end(),
                                    [](const std::weak_ptr<Node>& w) {
                                        NodeP n = w.lock();
                                        return !n || !n->grad || n->grad->buffer;
                                    }),
                     leaves.end());
    }
};
static thread_local PendingGradients pending_grads;

// Trial deletion, as a cycle collector does it: in the graph the pending gradients reach,
// count each node's handles that come from inside. A node with more handles than that is held
// from outside, and so is all it reaches; a leaf left over is held only by cycles and loses
// its gradient, and reference counting frees the rest.
PendingGradients::~PendingGradients() {
    targets.clear();
    std::vector<NodeP> roots;   // these handles are ours: not from outside
    for (auto& w : leaves)
        if (NodeP n = w.lock())
            if (n->grad && !n->grad->buffer) roots.push_back(n);
    std::sort(roots.begin(), roots.end());
    roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
    std::unordered_map<Node*, long> inside;
    std::vector<Node*> stack, reached;
    auto each_handle = [](Node* n, auto&& f) {
        for (const NodeP& s : n->src) f(s.get());
        if (n->grad) f(n->grad.get());
    };
    for (const NodeP& r : roots) {
        inside[r.get()] += 1;
        stack.push_back(r.get());
    }
    std::unordered_set<Node*> seen(stack.begin(), stack.end());
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        reached.push_back(n);
        each_handle(n, [&](Node* m) {
            inside[m] += 1;
            if (seen.insert(m).second) stack.push_back(m);
        });
    }
    std::unordered_set<Node*> held;
    for (Node* n : reached)
        if (n->weak_from_this().use_count() > inside[n] && held.insert(n).second)
            stack.push_back(n);
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        each_handle(n, [&](Node* m) {
            if (held.insert(m).second) stack.push_back(m);
        });
    }
    for (const NodeP& r : roots)
        if (!held.count(r.get())) r->grad.reset();
}

// Leaves made from lazy values (Tensor::randn(...).requires_grad()) are computed together, in
// one program, just before the next program runs: a model's initial parameters cost one
// compile, and parameters replaced before then (nn::Sequential's reseeding) cost nothing.
static thread_local std::vector<std::weak_ptr<Node>> pending_leaves;

// While a jit traces its function, realizes are collected instead of run.
static thread_local std::vector<NodeP>* jit_capture = nullptr;

// [REALIZE]; in_background: the program may still run when it returns (an optimizer's step)
static void realize_nodes(const std::vector<NodeP>& targets, bool now = false,
                          bool in_background = false);

// A constant that nothing differentiates or has computed.
static bool plain_const(const NodeP& n) {
    return n->op == Op::CONST && !n->buffer && !n->requires_grad && !n->leaf;
}

// Ops on constants fold to a constant as the graph is built, and a view of a constant is one
// too (a pad only of 0): no kernel computes the 1/n that a mean's gradient starts from.
// Reductions are not folded: a folded sum would not have the bits of the summing loop.
static bool fold_constant(Op op, DType dt, const std::vector<NodeP>& src, double& value) {
    if (src.empty() || !std::all_of(src.begin(), src.end(), plain_const)) return false;
    OpKind k = op_kind(op);
    if (k == OpKind::MOVEMENT) {
        value = src[0]->value;
        return op != Op::PAD || value == 0;
    }
    if (k != OpKind::UNARY && k != OpKind::BINARY && k != OpKind::TERNARY) return false;
    Num a[3];
    for (size_t i = 0; i < src.size(); i++) a[i] = num_of(src[i]->value, src[i]->dtype);
    Num r = alu_eval(op, dt, src[0]->dtype, a);
    const int64_t exact = int64_t(1) << 53;   // a constant holds its value as a double
    if (!dtype_is_float(dt) && (r.i > exact || r.i < -exact)) return false;
    value = num_double(r, dt);
    return true;
}

// A node's device: its buffer's once it has one, else the one its operands share, else the
// default device when it was built. A constant with no storage has none: like a Python number
// in PyTorch, it is computed on the device of the op that uses it.
static Device* node_device(const Node* n) { return n->buffer ? n->buffer->device : n->device; }

static NodeP node_make(Op op, DType dt, Shape shape, std::vector<NodeP> src, Loc loc,
                       std::vector<int64_t> arg = {}, double value = 0) {
    if (fold_constant(op, dt, src, value)) {
        op = Op::CONST;
        src.clear();
        arg.clear();
    }
    auto n = std::make_shared<Node>();
    n->op = op;
    n->dtype = dt;
    n->shape = std::move(shape);
    n->src = std::move(src);
    n->arg = std::move(arg);
    n->value = value;
    n->loc = is_library_loc(loc) ? user_loc : loc;
    n->phase = current_phase;
    if (no_grad_depth == 0 && dtype_is_float(dt))
        for (auto& s : n->src) n->requires_grad = n->requires_grad || s->requires_grad;
    const Node* placed = nullptr;   // the first operand with a device
    for (auto& s : n->src) {
        Device* d = node_device(s.get());
        if (!d) continue;
        if (placed && d != n->device)
            fail(strf("%s: operands on different devices: %s %s on %s and %s %s on %s; move one "
                      "with .to()", op_name(op), dtype_name(placed->dtype),
                      shape_str(placed->shape).c_str(), n->device->name(),
                      dtype_name(s->dtype), shape_str(s->shape).c_str(), d->name()),
                 n->loc);
        placed = s.get();
        n->device = d;
    }
    if (!n->device && op != Op::CONST) n->device = &default_device();
    return n;
}

// A node that computes must not read a buffer that an in-place update overwrote after the
// node was built. Views (movement ops) are exempt: like PyTorch's views they alias the storage
// and see the update; a computation reads through them.
static void check_fresh(const Node* n) {
    if (op_kind(n->op) == OpKind::MOVEMENT) return;
    // a view reads what its one source reads
    auto viewed = [](const Node* s) {
        return !s->buffer && op_kind(s->op) == OpKind::MOVEMENT ? s->src[0].get() : nullptr;
    };
    for (const NodeP& read : n->src)
        for (const Node* s = read.get(); s; s = viewed(s)) {
            const Buffer* b = s->buffer.get();
            uint64_t written_at = 0;   // a part of a buffer (a slice's rows): its whole's writes
            for (const Buffer* part = b; part; part = part->arena.get())
                written_at = std::max(written_at, part->written_at);
            if (!b || written_at <= n->built_at) continue;
            fail(strf("stale read: this %s %s %s reads a %s %s buffer that the in-place update "
                      "at %s overwrote after it was built; realize it before the update "
                      "(PyTorch computes it at once) or build it again",
                      op_name(n->op), dtype_name(n->dtype), shape_str(n->shape).c_str(),
                      dtype_name(s->dtype), shape_str(s->shape).c_str(),
                      loc_str(b->written_by).c_str()),
                 n->loc);
        }
}

static NodeP graph_const(double value, DType dt, const Shape& shape, Loc loc) {
    if (dt == DType::BOOL) value = value != 0;
    if (dt == DType::INT32 || dt == DType::INT64) value = double(saturate_int(dt, value));
    if (dt == DType::FLOAT32) value = double(float(value));
    return node_make(Op::CONST, dt, shape, {}, loc, {}, value);
}

static NodeP graph_unary(Op op, const NodeP& x, Loc loc) {
    return node_make(op, x->dtype, x->shape, {x}, loc);
}

static NodeP graph_cast(const NodeP& x, DType dt, Loc loc) {
    if (x->dtype == dt) return x;
    return node_make(Op::CAST, dt, x->shape, {x}, loc);
}

// Operands already have one shape and one dtype: the Tensor API broadcasts and promotes.
static NodeP graph_binary(Op op, const NodeP& a, const NodeP& b, Loc loc) {
    DType out = (op == Op::CMPLT || op == Op::CMPEQ) ? DType::BOOL : a->dtype;
    return node_make(op, out, a->shape, {a, b}, loc);
}

static NodeP graph_where(const NodeP& c, const NodeP& a, const NodeP& b, Loc loc) {
    return node_make(Op::WHERE, a->dtype, a->shape, {c, a, b}, loc);
}

// Reduced axes stay as size 1 (keepdim); the Tensor API reshapes them away when asked.
static NodeP graph_reduce(Op op, const NodeP& x, const std::vector<int>& axes, Loc loc) {
    Shape out = x->shape;
    std::vector<int64_t> arg;
    for (int a : axes) {
        if (x->shape[size_t(a)] == 1) continue;
        out[size_t(a)] = 1;
        arg.push_back(a);
    }
    if (arg.empty()) return x;
    std::sort(arg.begin(), arg.end());
    return node_make(op, x->dtype, out, {x}, loc, arg);
}

static NodeP graph_reshape(const NodeP& x, const Shape& shape, Loc loc) {
    check_shape(shape, "reshape", loc);
    if (shape_numel(shape) != shape_numel(x->shape))
        fail(strf("reshape: cannot reshape %s (%lld elements) to %s (%lld elements)",
                  shape_str(x->shape).c_str(), (long long)shape_numel(x->shape),
                  shape_str(shape).c_str(), (long long)shape_numel(shape)), loc);
    if (shape == x->shape) return x;
    // reshapes compose, unless the inner one is a realized value or a detach
    bool compose =
        x->op == Op::RESHAPE && !x->buffer && x->requires_grad == x->src[0]->requires_grad;
    const NodeP& base = compose ? x->src[0] : x;
    if (shape == base->shape) return base;
    return node_make(Op::RESHAPE, x->dtype, shape, {base}, loc);
}

static NodeP graph_permute(const NodeP& x, const std::vector<int>& order, Loc loc) {
    size_t n = x->shape.size();
    std::vector<bool> seen(n, false);
    bool ok = order.size() == n;
    for (int a : order) {
        if (!ok || a < 0 || size_t(a) >= n || seen[size_t(a)]) { ok = false; break; }
        seen[size_t(a)] = true;
    }
    if (!ok) {
        std::string o;
        for (size_t i = 0; i < order.size(); i++) o += (i ? "," : "") + std::to_string(order[i]);
        fail(strf("permute: [%s] is not a permutation of the %zu axes of shape %s", o.c_str(), n,
                  shape_str(x->shape).c_str()), loc);
    }
    Shape out(n);
    bool identity = true;
    for (size_t i = 0; i < n; i++) {
        out[i] = x->shape[size_t(order[i])];
        identity = identity && order[i] == int(i);
    }
    if (identity) return x;
    return node_make(Op::PERMUTE, x->dtype, out, {x}, loc,
                     std::vector<int64_t>(order.begin(), order.end()));
}

// Same rank; each axis keeps its size or grows from 1.
static NodeP graph_expand(const NodeP& x, const Shape& shape, Loc loc) {
    bool ok = shape.size() == x->shape.size();
    for (size_t i = 0; ok && i < shape.size(); i++)
        ok = shape[i] == x->shape[i] || (x->shape[i] == 1 && shape[i] >= 0);
    if (!ok)
        fail(strf("expand: cannot expand %s to %s", shape_str(x->shape).c_str(),
                  shape_str(shape).c_str()), loc);
    check_shape(shape, "expand", loc);
    if (shape == x->shape) return x;
    return node_make(Op::EXPAND, x->dtype, shape, {x}, loc);
}

static std::string pairs_str(const std::vector<std::pair<int64_t, int64_t>>& p) {
    std::string s = "[";
    for (size_t i = 0; i < p.size(); i++)
        s += strf("%s(%lld,%lld)", i ? "," : "", (long long)p[i].first, (long long)p[i].second);
    return s + "]";
}

static NodeP graph_pad(const NodeP& x, const std::vector<std::pair<int64_t, int64_t>>& p, Loc loc) {
    bool ok = p.size() == x->shape.size(), zero = true;
    for (auto& [b, a] : p) { ok = ok && b >= 0 && a >= 0; zero = zero && b == 0 && a == 0; }
    if (!ok)
        fail(strf("pad: %s out of range for shape %s (one non-negative pair per axis)",
                  pairs_str(p).c_str(), shape_str(x->shape).c_str()), loc);
    if (zero) return x;
    Shape out = x->shape;
    std::vector<int64_t> arg;
    for (size_t i = 0; i < p.size(); i++) {
        if (__builtin_add_overflow(out[i], p[i].first, &out[i]) ||
            __builtin_add_overflow(out[i], p[i].second, &out[i]))
            fail(strf("pad: %s makes shape %s too large", pairs_str(p).c_str(),
                      shape_str(x->shape).c_str()), loc);
        arg.push_back(p[i].first);
        arg.push_back(p[i].second);
    }
    check_shape(out, "pad", loc);
    return node_make(Op::PAD, x->dtype, out, {x}, loc, arg);
}

static NodeP graph_shrink(const NodeP& x, const std::vector<std::pair<int64_t, int64_t>>& p,
                          Loc loc) {
    bool ok = p.size() == x->shape.size(), full = true;
    for (size_t i = 0; ok && i < p.size(); i++) {
        ok = 0 <= p[i].first && p[i].first <= p[i].second && p[i].second <= x->shape[i];
        full = full && p[i].first == 0 && p[i].second == x->shape[i];
    }
    if (!ok)
        fail(strf("shrink: %s out of range for shape %s", pairs_str(p).c_str(),
                  shape_str(x->shape).c_str()), loc);
    if (full) return x;
    Shape out;
    std::vector<int64_t> arg;
    for (auto& [b, e] : p) { out.push_back(e - b); arg.push_back(b); arg.push_back(e); }
    // A range of rows of a realized tensor (a batch of a dataset) is a part of its buffer: the
    // view is a buffer at an offset, so a program reading it gets a pointer and does not
    // change (or compile again) with the offset. Not for tensors with a gradient history, nor
    // while a jit traces its step: a replay passes its inputs' buffers in place of the traced
    // ones, and a view would go on pointing into the traced input (tests/test_training.cpp).
    size_t cut = 0;   // axes before it keep one index, axes after it are whole
    while (cut + 1 < p.size() && p[cut].second - p[cut].first == 1) cut++;
    bool rows = x->buffer && x->op == Op::BUFFER && !x->requires_grad && !jit_capture;
    for (size_t d = cut + 1; rows && d < p.size(); d++)
        rows = p[d].first == 0 && p[d].second == x->shape[d];
    if (rows) {
        int64_t offset = 0, stride = 1;
        for (size_t d = p.size(); d-- > 0;) {
            offset += p[d].first * stride;
            stride *= x->shape[d];
        }
        NodeP n = node_make(Op::BUFFER, x->dtype, out, {}, loc);
        n->buffer = std::make_shared<Buffer>(x->buffer, offset * int64_t(dtype_size(x->dtype)),
                                             x->dtype, shape_numel(out));
        return n;
    }
    return node_make(Op::SHRINK, x->dtype, out, {x}, loc, arg);
}

static NodeP graph_flip(const NodeP& x, const std::vector<int>& axes, Loc loc) {
    std::vector<int64_t> arg;
    for (int a : axes)
        if (size_t(a) < x->shape.size() && x->shape[size_t(a)] > 1) arg.push_back(a);
    if (arg.empty()) return x;
    std::sort(arg.begin(), arg.end());
    return node_make(Op::FLIP, x->dtype, x->shape, {x}, loc, arg);
}

static NodeP graph_gather(const NodeP& src, const NodeP& index, int axis, Loc loc) {
    return node_make(Op::GATHER, src->dtype, index->shape, {src, index}, loc, {axis});
}

// Pointers to small values, open addressing in one array: the graph walks of every eager step
// insert each node once, and the passes walk every expression of a program once per analysis,
// where an unordered set or map allocates a hash node per insert.
template <typename T, int log2_slots> struct PointerIndex {
    using Slot = std::pair<const T*, int>;
    Slot first_slots[size_t(1) << log2_slots] = {};   // most walks stay in these
    std::vector<Slot> grown;                           // the slots once more are needed
    int shift = 64 - log2_slots;   // 2^(64 - shift) slots
    size_t count = 0;
    Slot* slots() { return grown.empty() ? first_slots : grown.data(); }
    const Slot* slots() const { return grown.empty() ? first_slots : grown.data(); }
    size_t capacity() const { return size_t(1) << (64 - shift); }
    size_t at(const T* p) const {   // p's slot, or the empty one where it would go
        // Fibonacci hashing: the product's top bits mix every bit of the address
        const Slot* s = slots();
        size_t mask = capacity() - 1,
               i = size_t((uint64_t(uintptr_t(p)) * 0x9E3779B97F4A7C15ull) >> shift);
        while (s[i].first && s[i].first != p) i = (i + 1) & mask;
        return i;
    }
    // false if p is there already; else puts it there with value v
    bool insert(const T* p, int v = 0) {
        size_t i = at(p);
        if (slots()[i].first == p) return false;
        if (2 * (count + 1) > capacity()) {
            std::vector<Slot> old(2 * capacity(), {nullptr, 0});
            old.swap(grown);   // old: the slots before, none while they were first_slots
            const Slot* before = old.empty() ? first_slots : old.data();
            size_t n = capacity();
            shift--;
            for (size_t k = 0; k < n; k++)
                if (before[k].first) grown[at(before[k].first)] = before[k];
            i = at(p);
        }
        slots()[i] = {p, v};
        count++;
        return true;
    }
    const int* find(const T* p) const {
        const Slot& e = slots()[at(p)];
        return e.first ? &e.second : nullptr;
    }
    int* find(const T* p) { return const_cast<int*>(std::as_const(*this).find(p)); }
};
using NodeIndex = PointerIndex<Node, 8>;
// Pointers to values of any type: the index gives each its place in one array.
template <typename T, typename V, int log2_slots> struct PointerMap {
    PointerIndex<T, log2_slots> index;
    std::vector<V> values;
    V* find(const T* p) {
        int* i = index.find(p);
        return i ? &values[size_t(*i)] : nullptr;
    }
    void insert(const T* p, V v) {   // p is not there yet
        index.insert(p, int(values.size()));
        values.push_back(std::move(v));
    }
};

// One line per node in topological order: "%3 = ADD %1 %2  float32 [64,16]  main.cpp:7".
// Sources before users. Realized nodes are leaves unless through_realized (autograd needs the
// history of realized values).
// places: where given, each node's index in the order (it is the walk's own index).
static std::vector<Node*> graph_toposort(const std::vector<NodeP>& roots,
                                         bool through_realized = false,
                                         NodeIndex* places = nullptr) {
    std::vector<Node*> order;
    NodeIndex own;
    NodeIndex& seen = places ? *places : own;
    std::vector<std::pair<Node*, size_t>> stack;
    for (const NodeP& r : roots) {
        if (!seen.insert(r.get())) continue;
        stack.push_back({r.get(), 0});
        while (!stack.empty()) {
            auto& [n, i] = stack.back();
            if (i < n->src.size() && (through_realized || !n->buffer)) {
                Node* s = n->src[i++].get();
                if (seen.insert(s)) stack.push_back({s, 0});
            } else {
                if (places) *places->find(n) = int(order.size());
                order.push_back(n);
                stack.pop_back();
            }
        }
    }
    return order;
}

static std::string graph_listing(const std::vector<NodeP>& roots) {
    std::vector<Node*> order = graph_toposort(roots);
    std::unordered_map<Node*, int> id;
    std::string out;
    for (Node* n : order) {
        int k = int(id.size());
        id[n] = k;
        std::string line = strf("%%%d = %s", k, n->buffer ? "BUFFER" : op_name(n->op));
        for (auto& s : n->src)
            if (!n->buffer) line += strf(" %%%d", id[s.get()]);
        if (n->op == Op::CONST) line += strf(" %g", n->value);
        if (n->op == Op::RAND) line += strf(" seed=%.0f", n->value);
        if (!n->arg.empty()) {
            line += " {";
            for (size_t i = 0; i < n->arg.size(); i++)
                line += (i ? "," : "") + std::to_string(n->arg[i]);
            line += "}";
        }
        line = strf("%-40s %-8s %-14s %s\n", line.c_str(), dtype_name(n->dtype),
                    shape_str(n->shape).c_str(), loc_str(n->loc).c_str());
        out += line;
    }
    return out;
}

}  // namespace detail

// ---- [COMPOSED] the Tensor API: creation, elementwise, reductions, movement ------ >>composed
// Each method checks its arguments (errors name the op and the shapes), broadcasts and
// promotes dtypes like PyTorch, and composes primitives. The formula sits beside each one.

namespace detail {
static const double LN2 = 0.693147180559945309417, PI = 3.14159265358979323846;

static Tensor wrap(NodeP n) { return Tensor(std::move(n)); }
static const NodeP& N(const Tensor& t) { return t.node(); }
// An operand never assigned (Tensor h; h + x): the error names the op and the caller's line,
// which Tensor::node()'s alone cannot. Checked where most calls first touch their operands.
static const Tensor& check_defined(const Tensor& t, const char* op, Loc loc) {
    if (!t.defined())
        fail(strf("%s: an operand is undefined (default-constructed and never assigned)", op),
             loc);
    return t;
}

static Tensor un(Op op, const Tensor& x, Loc loc) { return wrap(graph_unary(op, N(x), loc)); }

static Tensor as_float(const Tensor& x, Loc loc) {
    bool is_float = dtype_is_float(check_defined(x, "elementwise op", loc).dtype());
    return is_float ? x : x.cast(DType::FLOAT32, loc);
}

static Tensor const_like(const Tensor& x, double v, DType dt, Loc loc) {
    return wrap(graph_const(v, dt, x.shape(), loc));
}

// A scalar keeps the tensor's dtype, except that a float scalar makes an integer tensor float32
// and an integer scalar (not a bool) next to a bool tensor makes it int64, as in PyTorch.
static DType scalar_dtype(DType t, Scalar s) {
    if (s.is_float && !dtype_is_float(t)) return DType::FLOAT32;
    if (t == DType::BOOL && !s.is_bool) return DType::INT64;
    return t;
}

// Broadcast and promote two operands of an elementwise op.
static std::pair<Tensor, Tensor> operands(const Tensor& a, const Tensor& b, const char* op, Loc loc,
                                          bool need_float = false) {
    check_defined(a, op, loc), check_defined(b, op, loc);
    Shape s = broadcast_shape(a.shape(), b.shape(), op, loc);
    DType dt = promote(a.dtype(), b.dtype());
    if (need_float && !dtype_is_float(dt)) dt = DType::FLOAT32;
    return {a.cast(dt, loc).expand(s, loc), b.cast(dt, loc).expand(s, loc)};
}

static Tensor bin(Op op, const Tensor& a, const Tensor& b, const char* name, Loc loc) {
    auto [x, y] = operands(a, b, name, loc);
    return wrap(graph_binary(op, N(x), N(y), loc));
}

static Tensor scalar_operand(const Tensor& like, Scalar s, const char* op, Loc loc) {
    DType dt = scalar_dtype(check_defined(like, op, loc).dtype(), s);
    return const_like(like, s.value, dt, loc);
}

static void check_not_bool(const Tensor& x, const char* op, Loc loc) {
    if (check_defined(x, op, loc).dtype() == DType::BOOL)
        fail(strf("%s: not supported for bool tensors", op), loc);
}

// x + c, x * c with c in x's dtype: the building blocks of the compositions below
static Tensor add_c(const Tensor& x, double c, Loc loc) {
    return wrap(graph_binary(Op::ADD, N(x), graph_const(c, x.dtype(), x.shape(), loc), loc));
}
static Tensor mul_c(const Tensor& x, double c, Loc loc) {
    return wrap(graph_binary(Op::MUL, N(x), graph_const(c, x.dtype(), x.shape(), loc), loc));
}
static Tensor add(const Tensor& a, const Tensor& b, Loc loc) {
    return bin(Op::ADD, a, b, "add", loc);
}
static Tensor mul(const Tensor& a, const Tensor& b, Loc loc) {
    return bin(Op::MUL, a, b, "mul", loc);
}
static Tensor neg(const Tensor& x, Loc loc) { return un(Op::NEG, x, loc); }
// An order-reversing map that is its own inverse, so that min is a max: -x, and for integers
// -1 - x (two's complement's not), which takes the lowest value to the highest, where -x
// wraps to the lowest again
static Tensor reversed_order(const Tensor& x, Loc loc) {
    return dtype_is_float(x.dtype()) ? neg(x, loc) : add_c(neg(x, loc), -1, loc);
}
// the dtype's lowest value: -∞, INT32_MIN, INT64_MIN (-2^63: exact as a double) or false
static double lowest_value(DType dt) {
    if (dtype_is_float(dt)) return -INFINITY;
    if (dt == DType::INT32) return INT32_MIN;
    return dt == DType::BOOL ? 0 : double(INT64_MIN);
}

static std::atomic<uint64_t> seed_counter{0};

// 64-bit seeds fold to the 32 bits the counter-based generator takes.
static uint64_t fold_seed(uint64_t seed) { return (seed ^ (seed >> 32)) & 0xffffffffull; }
static uint64_t mix_seed(uint64_t seed, uint64_t stream) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A sum of nothing is 0; a maximum (minimum, argmax) of nothing has no value, as in PyTorch.
static void check_not_empty(const Shape& s, const std::vector<int>& axes, const char* op, Loc loc) {
    for (int a : axes)
        if (size_t(a) < s.size() && s[size_t(a)] == 0)
            fail(strf("%s: axis %d of shape %s is empty, and an empty %s has no value", op, a,
                      shape_str(s).c_str(), op), loc);
}

static Tensor reduce(Op op, const Tensor& x, std::vector<int> axes, bool all, bool keepdim,
                     const char* name, Loc loc) {
    check_defined(x, name, loc);
    if (all) { axes.clear(); for (int i = 0; i < x.ndim(); i++) axes.push_back(i); }
    std::vector<int> ax = normalize_axes(axes, x.shape(), name, loc);
    if (x.ndim() == 0) return x;   // a scalar reduced over its one (implicit) axis
    if (op == Op::REDUCE_MAX) check_not_empty(x.shape(), ax, name, loc);
    Tensor r = wrap(graph_reduce(op, N(x), ax, loc));
    if (keepdim) return r.reshape(r.shape(), loc);
    Shape out;
    for (int i = 0; i < x.ndim(); i++)
        if (std::find(ax.begin(), ax.end(), i) == ax.end()) out.push_back(x.shape()[size_t(i)]);
    return r.reshape(out, loc);
}

// Python-style index: negative counts from the end.
static int64_t wrap_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
}  // namespace detail

using namespace detail;

// -- creation
uint64_t Tensor::next_seed() { return seed_counter++; }
void manual_seed(uint64_t seed) { seed_counter = seed; }
uint64_t rng_state() { return seed_counter; }

Tensor Tensor::full(const Shape& shape, Scalar value, DType dtype, Loc loc) {
    check_shape(shape, "full", loc);
    return wrap(graph_const(value.value, dtype, shape, loc));
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Loc loc) {
    check_shape(shape, "zeros", loc);
    return full(shape, 0, dtype, loc);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Loc loc) {
    check_shape(shape, "ones", loc);
    return full(shape, 1, dtype, loc);
}

// on x's device: a constant made on the default device moves there
static Tensor on_device_of(const Tensor& x, const Tensor& made, Loc loc) {
    return made.device() == x.device() ? made : made.to(x.device(), loc);
}
Tensor Tensor::zeros_like(const Tensor& x, Loc loc) { return full_like(x, 0, loc); }
Tensor Tensor::ones_like(const Tensor& x, Loc loc) { return full_like(x, 1, loc); }
Tensor Tensor::full_like(const Tensor& x, Scalar value, Loc loc) {
    check_defined(x, "full_like", loc);
    return on_device_of(x, full(x.shape(), value, x.dtype(), loc), loc);
}
static void check_float_like(const Tensor& x, const char* op, Loc loc) {
    if (!dtype_is_float(check_defined(x, op, loc).dtype()))
        fail(strf("%s: %s %s is not a float tensor (random values are float)", op,
                  dtype_name(x.dtype()), shape_str(x.shape()).c_str()), loc);
}
Tensor Tensor::rand_like(const Tensor& x, uint64_t seed, Loc loc) {
    check_float_like(x, "rand_like", loc);
    return on_device_of(x, rand(x.shape(), seed, loc).cast(x.dtype(), loc), loc);
}
Tensor Tensor::randn_like(const Tensor& x, uint64_t seed, Loc loc) {
    check_float_like(x, "randn_like", loc);
    return on_device_of(x, randn(x.shape(), seed, loc).cast(x.dtype(), loc), loc);
}

// two uniform floats are 24 random bits each (k / 2^24): v = k1·2^24 + k2 in [0, 2^48), and
// low + v mod (high - low), whose bias is below (high - low) / 2^48
Tensor Tensor::randint(int64_t low, int64_t high, const Shape& shape, uint64_t seed, Loc loc) {
    if (low >= high)
        fail(strf("randint: low %lld must be below high %lld", (long long)low,
                  (long long)high), loc);
    const double two24 = 16777216;
    Tensor k1 = mul_c(rand(shape, mix_seed(seed, 0), loc), two24, loc).cast(DType::INT64, loc);
    Tensor k2 = mul_c(rand(shape, mix_seed(seed, 1), loc), two24, loc).cast(DType::INT64, loc);
    Tensor v = add(mul_c(k1, two24, loc), k2, loc);
    Tensor n = const_like(v, double(high - low), DType::INT64, loc);
    return add_c(wrap(graph_binary(Op::MOD, N(v), N(n), loc)), double(low), loc);
}

// start + i·step for the first half, end - (steps-1-i)·step for the second, as PyTorch
Tensor Tensor::linspace(double start, double end, int64_t steps, Loc loc) {
    UserLocScope at(loc);   // for the operators below
    if (steps < 0) fail(strf("linspace: negative steps %lld", (long long)steps), loc);
    if (steps == 1) return full({1}, start, DType::FLOAT32, loc);
    double step = steps > 1 ? (end - start) / double(steps - 1) : 0;
    Tensor i = arange(double(0), double(steps), 1.0, loc);
    Tensor first = i * step + start, second = end - (double(steps - 1) - i) * step;
    return where(i < double(steps / 2), first, second, loc);
}

Tensor Tensor::arange(Scalar stop, Loc loc) { return arange(0, stop, 1, loc); }
// start + i·step for i in [0, ceil((stop-start)/step))
Tensor Tensor::arange(Scalar start, Scalar stop, Scalar step, Loc loc) {
    if (step.value == 0) fail("arange: step must be nonzero", loc);
    double count = std::ceil((stop.value - start.value) / step.value);
    int64_t n = count > 0 ? int64_t(count) : 0;
    DType dt = (start.is_float || stop.is_float || step.is_float) ? DType::FLOAT32 : DType::INT32;
    Tensor idx = wrap(node_make(Op::ARANGE, DType::INT32, {n}, {}, loc)).cast(dt, loc);
    return add_c(mul_c(idx, step.value, loc), start.value, loc);
}

Tensor Tensor::eye(int64_t n, DType dtype, Loc loc) {
    UserLocScope at(loc);   // for the operators below
    if (n < 0) fail(strf("eye: negative size %lld", (long long)n), loc);
    Tensor i = arange(n, loc);
    return (i.reshape({n, 1}, loc) == i.reshape({1, n}, loc)).cast(dtype, loc);
}

Tensor Tensor::rand(const Shape& shape, uint64_t seed, Loc loc) {
    check_shape(shape, "rand", loc);
    return wrap(node_make(Op::RAND, DType::FLOAT32, shape, {}, loc, {}, double(fold_seed(seed))));
}

// Box-Muller: sqrt(-2 ln(1-u1)) · cos(2π u2), with u1, u2 from two streams of the seed
Tensor Tensor::randn(const Shape& shape, uint64_t seed, Loc loc) {
    check_shape(shape, "randn", loc);
    Tensor u1 = rand(shape, mix_seed(seed, 0), loc), u2 = rand(shape, mix_seed(seed, 1), loc);
    Tensor r = mul_c(add_c(neg(u1, loc), 1, loc).log(loc), -2, loc).sqrt(loc);
    return mul(r, mul_c(u2, 2 * PI, loc).cos(loc), loc);
}

// rand whose seed is seed + the value of an integer scalar tensor, read when the program runs
static Tensor rand_offset(const Shape& shape, uint64_t seed, const Tensor& offset, Loc loc) {
    Tensor o = offset.reshape(Shape(shape.size(), 1), loc).expand(shape, loc);
    return wrap(node_make(Op::RAND, DType::FLOAT32, shape, {N(o)}, loc, {},
                          double(fold_seed(seed))));
}

template <typename T>
static Tensor tensor_from_data(const std::vector<T>& values, const Shape& shape_in, DType dt,
                               Loc loc) {
    Shape shape = shape_in == Shape{-1} ? Shape{int64_t(values.size())} : shape_in;
    check_shape(shape, "from_vector", loc);
    if (shape_numel(shape) != int64_t(values.size()))
        fail(strf("from_vector: %zu values do not fill shape %s", values.size(),
                  shape_str(shape).c_str()), loc);
    Device& dev = default_device();
    auto buf = std::make_shared<Buffer>(&dev, dt, int64_t(values.size()));
    dev.copy_in(buf->ptr, values.data(), buf->bytes());
    NodeP n = node_make(Op::BUFFER, dt, shape, {}, loc);
    n->buffer = buf;
    return wrap(n);
}
Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, Loc loc) {
    return tensor_from_data(v, shape, DType::FLOAT32, loc);
}
Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& shape, Loc loc) {
    return tensor_from_data(v, shape, DType::FLOAT64, loc);
}
Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& shape, Loc loc) {
    return tensor_from_data(v, shape, DType::INT32, loc);
}
Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& shape, Loc loc) {
    return tensor_from_data(v, shape, DType::INT64, loc);
}
Tensor Tensor::from_vector(const std::vector<bool>& v, const Shape& shape, Loc loc) {
    return tensor_from_data(std::vector<uint8_t>(v.begin(), v.end()), shape, DType::BOOL, loc);
}


// -- what it is
const NodeP& Tensor::node() const {
    if (!node_) fail("tensor is undefined (default-constructed and never assigned)");
    return node_;
}
const Shape& Tensor::shape() const { return node()->shape; }
int Tensor::ndim() const { return int(shape().size()); }
int64_t Tensor::numel() const { return shape_numel(shape()); }
bool Tensor::realized() const { return node()->buffer != nullptr; }
DType Tensor::dtype() const { return node()->dtype; }
int64_t Tensor::size(int axis) const {
    return shape()[size_t(normalize_axis(axis, shape().size(), "size", shape(), {}, false))];
}

// -- elementwise
Tensor operator-(Operand x) {
    check_not_bool(x.tensor, "neg", x.loc);
    return un(Op::NEG, x.tensor, x.loc);
}
Tensor operator+(Operand a, const Tensor& b) { return bin(Op::ADD, a.tensor, b, "add", a.loc); }
Tensor operator*(Operand a, const Tensor& b) { return bin(Op::MUL, a.tensor, b, "mul", a.loc); }
Tensor operator-(Operand a, const Tensor& b) {                         // a + (-b)
    auto [x, y] = operands(a.tensor, b, "sub", a.loc);
    check_not_bool(x, "sub", a.loc);
    return add(x, neg(y, a.loc), a.loc);
}
// IEEE division, the correctly rounded quotient as PyTorch's (21/7 is 3), not a·(1/b)
Tensor operator/(Operand a, const Tensor& b) {
    auto [x, y] = operands(a.tensor, b, "div", a.loc, true);
    return wrap(graph_binary(Op::DIV, N(x), N(y), a.loc));
}
// Integers: C's remainder, moved by b where its sign differs from b's (x % 0 is 0).
// Floats: r = a - b·floor(a/b) in float64 (in float32, b·floor(a/b) rounds by as much as b
// itself once a/b passes 2^24). The quotient, rounded, may be a whole number too low or too
// high: r is then b further on, or its sign differs from b's, and moves back by b. A zero r
// is +0 (PyTorch's takes a's sign). A finite a over an infinite b is a itself, or b where
// their signs differ. The gradient is 1 for a and -floor(a/b) for b, as PyTorch's.
Tensor operator%(Operand a_in, const Tensor& b_in) {
    Loc loc = a_in.loc;
    UserLocScope at(loc);   // for the operators below
    auto [a, b] = operands(a_in.tensor, b_in, "remainder", loc);
    check_not_bool(a, "remainder", loc);
    if (!dtype_is_float(a.dtype())) {
        Tensor r = wrap(graph_binary(Op::MOD, N(a), N(b), loc));
        return where((r != 0).minimum((r < 0) != (b < 0), loc), r + b, r, loc);
    }
    Tensor a64 = a.cast(DType::FLOAT64, loc), b64 = b.cast(DType::FLOAT64, loc);
    Tensor q = (a64 / b64).floor(loc), r;
    if (a.dtype() == DType::FLOAT32) {
        // q = high + low, each times a float32 b exact in float64 (27 and 26 bits by 24), and
        // so is what they leave of a: r is exact for quotients below 2^53
        Tensor high = mul_c(mul_c(q, 1.0 / 67108864, loc).floor(loc), 67108864, loc);
        r = (a64 - b64 * high) - b64 * (q - high);
    } else {
        r = a64 - b64 * q;
    }
    Tensor same_sign = (r < 0) == (b64 < 0);
    r = where(same_sign.minimum(r.abs(loc) >= b64.abs(loc), loc), r - b64, r, loc);
    r = where((r != 0).minimum((r < 0) != (b64 < 0), loc), r + b64, r, loc).cast(a.dtype(), loc);
    Tensor over_infinity = where((a != 0).minimum((a < 0) != (b < 0), loc), b, a, loc);
    return where(a.isfinite(loc).minimum(b.isinf(loc), loc), over_infinity, r, loc);
}
Tensor operator<(Operand a, const Tensor& b) { return bin(Op::CMPLT, a.tensor, b, "lt", a.loc); }
Tensor operator>(Operand a, const Tensor& b) { return bin(Op::CMPLT, b, a.tensor, "gt", a.loc); }
Tensor operator==(Operand a, Operand b) { return bin(Op::CMPEQ, a.tensor, b.tensor, "eq", a.loc); }
Tensor operator!=(Operand a, Operand b) {
    return bin(Op::CMPEQ, a.tensor, b.tensor, "ne", a.loc).logical_not(a.loc);
}
Tensor operator<=(Operand a, const Tensor& b) {                        // (a < b) or (a == b)
    auto [x, y] = operands(a.tensor, b, "le", a.loc);
    return bin(Op::CMPLT, x, y, "le", a.loc).maximum(bin(Op::CMPEQ, x, y, "le", a.loc), a.loc);
}
Tensor operator>=(Operand a, const Tensor& b) {                        // (b < a) or (a == b)
    auto [x, y] = operands(a.tensor, b, "ge", a.loc);
    return bin(Op::CMPLT, y, x, "ge", a.loc).maximum(bin(Op::CMPEQ, x, y, "ge", a.loc), a.loc);
}
#define TG_SCALAR_OPERATORS(op)                                                                \
    Tensor operator op(Operand a, Scalar b) {                                                  \
        Tensor s = scalar_operand(a.tensor, b, "operator" #op, a.loc);                         \
        return Operand(a.tensor, a.loc) op s;                                                  \
    }                                                                                          \
    Tensor operator op(Scalar a, Operand b) {                                                  \
        Tensor s = scalar_operand(b.tensor, a, "operator" #op, b.loc);                         \
        return Operand(s, b.loc) op b.tensor;                                                  \
    }
TG_SCALAR_OPERATORS(+) TG_SCALAR_OPERATORS(-) TG_SCALAR_OPERATORS(*) TG_SCALAR_OPERATORS(/)
TG_SCALAR_OPERATORS(%)
TG_SCALAR_OPERATORS(<) TG_SCALAR_OPERATORS(<=) TG_SCALAR_OPERATORS(>) TG_SCALAR_OPERATORS(>=)
TG_SCALAR_OPERATORS(==) TG_SCALAR_OPERATORS(!=)
#undef TG_SCALAR_OPERATORS

Tensor Tensor::cast(DType dtype, Loc loc) const {
    check_defined(*this, "cast", loc);
    if (dtype == DType::INDEX) fail("cast: index is not a tensor dtype", loc);
    return wrap(graph_cast(node(), dtype, loc));
}
Tensor Tensor::exp2(Loc loc) const { return un(Op::EXP2, as_float(*this, loc), loc); }
Tensor Tensor::log2(Loc loc) const { return un(Op::LOG2, as_float(*this, loc), loc); }
Tensor Tensor::sin(Loc loc) const { return un(Op::SIN, as_float(*this, loc), loc); }
Tensor Tensor::sqrt(Loc loc) const { return un(Op::SQRT, as_float(*this, loc), loc); }
Tensor Tensor::reciprocal(Loc loc) const { return un(Op::RECIP, as_float(*this, loc), loc); }
// e^x = 2^(x / ln2)
Tensor Tensor::exp(Loc loc) const { return mul_c(as_float(*this, loc), 1 / LN2, loc).exp2(loc); }
// ln x = log2(x) · ln2
Tensor Tensor::log(Loc loc) const { return mul_c(log2(loc), LN2, loc); }
Tensor Tensor::cos(Loc loc) const { return un(Op::COS, as_float(*this, loc), loc); }
Tensor Tensor::rsqrt(Loc loc) const { return sqrt(loc).reciprocal(loc); }
// sigmoid and tanh use e = e^-|x| <= 1, with |x| = s·x for s = ±1 the sign of x (s = 1 at 0):
// nothing overflows, so values and gradients stay finite where they saturate, and the sign is
// a constant factor in the gradient.
static Tensor sign_pm1(const Tensor& x, Loc loc) {
    Tensor one = const_like(x, 1, x.dtype(), loc);
    return where(x < 0, neg(one, loc), one, loc);
}
// σ(x) = 1/(1 + e) for x >= 0, e/(1 + e) for x < 0
Tensor Tensor::sigmoid(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(*this, loc);
    Tensor e = neg(mul(x, sign_pm1(x, loc), loc), loc).exp(loc);
    Tensor r = add_c(e, 1, loc).reciprocal(loc);
    return where(x < 0, mul(e, r, loc), r, loc);
}
// tanh x = s·(1 - e²)/(1 + e²)
Tensor Tensor::tanh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(*this, loc), sign = sign_pm1(x, loc);
    Tensor e2 = mul_c(mul(x, sign, loc), -2, loc).exp(loc);
    return mul(add_c(neg(e2, loc), 1, loc) / add_c(e2, 1, loc), sign, loc);
}
// relu x = 0 where x <= 0, else x: relu'(0) = 0, and NaN passes through with its gradient, as
// in PyTorch
Tensor Tensor::relu(Loc loc) const {
    UserLocScope at(loc);
    return where(*this <= 0, 0, *this, loc);
}
// gelu x = x/2 · (1 + erf(x/√2)) = x/2 · erfc(-x/√2), which keeps its precision where x is
// far below 0; tanh_approximation: x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))
Tensor Tensor::gelu(bool tanh_approximation, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(*this, loc);
    if (tanh_approximation) {
        Tensor inner = mul_c(add(x, mul_c(mul(mul(x, x, loc), x, loc), 0.044715, loc), loc),
                             std::sqrt(2 / PI), loc);
        return mul(mul_c(x, 0.5, loc), add_c(inner.tanh(loc), 1, loc), loc);
    }
    return mul(mul_c(x, 0.5, loc), mul_c(x, -1 / std::sqrt(2.0), loc).erfc(loc), loc);
}
Tensor Tensor::silu(Loc loc) const {
    Tensor x = as_float(*this, loc);
    return mul(x, x.sigmoid(loc), loc);
}
// the slope's side at 0 and for NaN, as PyTorch's
Tensor Tensor::leaky_relu(double negative_slope, Loc loc) const {
    UserLocScope at(loc);
    Tensor x = as_float(*this, loc);
    return where(x > 0, x, mul_c(x, negative_slope, loc), loc);
}
// The exponential sees min(x, 0) (and softplus βx at most its threshold): a where passes the
// side it did not pick a zero gradient, and 0 · e^x would be NaN where e^x overflows.
Tensor Tensor::elu(double alpha, Loc loc) const {
    UserLocScope at(loc);
    Tensor x = as_float(*this, loc), positive = x > 0;
    Tensor below = where(positive, 0, x, loc).expm1(loc);   // + 0: -0 gives 0, as PyTorch's
    return where(positive, x, add_c(mul_c(below, alpha, loc), 0, loc), loc);
}
Tensor Tensor::softplus(double beta, double threshold, Loc loc) const {
    UserLocScope at(loc);
    Tensor x = as_float(*this, loc), bx = mul_c(x, beta, loc), linear = bx > threshold;
    Tensor smooth = mul_c(add_c(where(linear, 0, bx, loc).exp(loc), 1, loc).log(loc), 1 / beta,
                          loc);
    return where(linear, x, smooth, loc);
}
// (x > 0) - (x < 0), as PyTorch's: NaN and -0 give 0; bool stays bool
Tensor Tensor::sign(Loc loc) const {
    check_defined(*this, "sign", loc);
    if (dtype() == DType::BOOL) return *this;
    UserLocScope at(loc);
    Tensor x = detach();
    return where(x > 0, 1, where(x < 0, -1, const_like(x, 0, x.dtype(), loc), loc), loc);
}
// |x| = max(x, -x) + 0: the + 0 turns -0 into +0 (max(-0, +0) may be either); |x|'(0) = 0
Tensor Tensor::clamp(std::optional<Scalar> min, std::optional<Scalar> max, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    check_not_bool(*this, "clamp", loc);
    Tensor y = detach();   // NaN fails both tests and stays
    if (min) y = where(y < *min, *min, y, loc);
    if (max) y = where(y > *max, *max, y, loc);   // after min: min > max gives max
    if (!tracks_grad()) return y;
    // x itself, with its gradient, where min <= x <= max (not at NaN)
    Tensor inside = const_like(*this, 1, DType::BOOL, loc);
    if (min) inside = inside.minimum(*this >= *min, loc);
    if (max) inside = inside.minimum(*this <= *max, loc);
    return where(inside, *this, y, loc);
}
Tensor Tensor::clip(std::optional<Scalar> min, std::optional<Scalar> max, Loc loc) const {
    return clamp(min, max, loc);
}
// weight < 1/2: x + w·(end - x); else end - (1 - w)·(end - x)
Tensor Tensor::lerp(const Tensor& end, const Tensor& weight, Loc loc) const {
    UserLocScope at(loc);
    Tensor d = end - *this;
    return where(weight.abs(loc) < 0.5, *this + weight * d, end - (1.0 - weight) * d, loc);
}
Tensor Tensor::lerp(const Tensor& end, double weight, Loc loc) const {
    UserLocScope at(loc);
    Tensor d = end - *this;
    return std::fabs(weight) < 0.5 ? *this + d * weight : end - d * (1 - weight);
}
// the row-major positions of x's nonzero elements, read from the device
static std::vector<int64_t> nonzero_positions(const Tensor& x) {
    Tensor nonzero = x.dtype() == DType::BOOL ? x : x != 0;
    std::vector<bool> flags = nonzero.to_vector<bool>();
    std::vector<int64_t> positions;
    for (size_t i = 0; i < flags.size(); i++)
        if (flags[i]) positions.push_back(int64_t(i));
    return positions;
}
Tensor Tensor::nonzero(Loc loc) const {
    check_defined(*this, "nonzero", loc);
    std::vector<int64_t> positions = nonzero_positions(*this), coordinates;
    const Shape& shape = this->shape();
    for (int64_t at : positions) {
        size_t first = coordinates.size();
        coordinates.resize(first + shape.size());
        for (size_t d = shape.size(); d-- > 0; at /= shape[d])
            coordinates[first + d] = at % shape[d];
    }
    Shape out = {int64_t(positions.size()), int64_t(shape.size())};
    return on_device_of(*this, Tensor::from_vector(coordinates, out, loc), loc);
}
// Sorted on the host in double (exact for float32 and float64) or int64 (integers, bool)
Unique Tensor::unique(Loc loc) const {
    check_defined(*this, "unique", loc);
    bool whole = !dtype_is_float(dtype());
    std::vector<int64_t> ints = whole ? to_vector<int64_t>() : std::vector<int64_t>();
    std::vector<double> reals = whole ? std::vector<double>() : to_vector<double>();
    size_t n = whole ? ints.size() : reals.size();
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto before = [&](int64_t a, int64_t b) {   // NaN after every number
        if (whole) return ints[size_t(a)] < ints[size_t(b)];
        double x = reals[size_t(a)], y = reals[size_t(b)];
        return std::isnan(y) ? !std::isnan(x) : x < y;
    };
    std::stable_sort(order.begin(), order.end(), before);
    std::vector<int64_t> inverse(n), counts, value_ints;
    std::vector<double> value_reals;
    for (size_t k = 0; k < n; k++) {
        size_t at = size_t(order[k]);
        bool same = k > 0 && !before(order[k - 1], order[k]) && !before(order[k], order[k - 1]) &&
                    (whole || !std::isnan(reals[at]));
        if (!same) {
            counts.push_back(0);
            if (whole) value_ints.push_back(ints[at]);
            else value_reals.push_back(reals[at]);
        }
        counts.back()++;
        inverse[at] = int64_t(counts.size()) - 1;
    }
    Tensor values = whole ? from_vector(value_ints, {-1}, loc)
                          : from_vector(value_reals, {-1}, loc);
    return {on_device_of(*this, values.cast(dtype(), loc), loc),
            on_device_of(*this, from_vector(inverse, shape(), loc), loc),
            on_device_of(*this, from_vector(counts, {-1}, loc), loc)};
}
static void check_mask(const Tensor& x, const Tensor& mask, const char* op, Loc loc) {
    check_defined(x, op, loc), check_defined(mask, op, loc);
    if (mask.dtype() != DType::BOOL)
        fail(strf("%s: the mask is %s %s; it must be bool (x < 0, x == y, ...)", op,
                  dtype_name(mask.dtype()), shape_str(mask.shape()).c_str()), loc);
}
Tensor Tensor::masked_select(const Tensor& mask, Loc loc) const {
    check_mask(*this, mask, "masked_select", loc);
    Shape both = broadcast_shape(shape(), mask.shape(), "masked_select", loc);
    std::vector<int64_t> positions = nonzero_positions(mask.expand(both, loc));
    Tensor picks = on_device_of(*this, Tensor::from_vector(positions, {-1}, loc), loc);
    return expand(both, loc).reshape({-1}, loc).gather(0, picks, loc);
}
Tensor Tensor::masked_fill(const Tensor& mask, Scalar value, Loc loc) const {
    check_mask(*this, mask, "masked_fill", loc);
    // the value in x's dtype, as PyTorch casts it (2.5 into an int tensor is 2)
    return where(mask, const_like(*this, value.value, dtype(), loc), *this, loc);
}
// ln(1 + x) as ln(u) - ((u - 1) - x) / u with u = 1 + x rounded: the second term is the
// rounding of u, taken where it matters (|x| < 1/2; elsewhere x is 0 in it, so it is 0 and
// no 0/0 reaches the gradient); its own gradient is nearly 0, so d/dx is 1/u
Tensor Tensor::log1p(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(*this, loc);
    Tensor small = x.abs(loc) < 0.5, xs = where(small, x, 0.0, loc);
    Tensor us = add_c(xs, 1, loc);
    Tensor rounding = mul(add(add_c(us, -1, loc), neg(xs, loc), loc), us.reciprocal(loc), loc);
    return add(add_c(x, 1, loc).log(loc), neg(where(small, rounding, 0.0, loc), loc), loc);
}
// e^x - 1: for |x| < 1/2 the series x(1 + x/2(1 + x/3(1 + ...))) to x^18/18! (below 1e-17 of
// the value, so float64 too), elsewhere exp(x) - 1, which loses nothing there
Tensor Tensor::expm1(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(*this, loc);
    Tensor small = x.abs(loc) < 0.5, xs = where(small, x, 0.0, loc);
    Tensor p = const_like(x, 1, x.dtype(), loc);
    for (int k = 18; k >= 2; k--) p = add_c(mul(mul_c(xs, 1.0 / k, loc), p, loc), 1, loc);
    return where(small, mul(xs, p, loc), add_c(x.exp(loc), -1, loc), loc);
}
// x·x; a bool squares as int64, as in PyTorch
Tensor Tensor::square(Loc loc) const {
    check_defined(*this, "square", loc);
    Tensor x = dtype() == DType::BOOL ? cast(DType::INT64, loc) : *this;
    return mul(x, x, loc);
}
// A float with |x| >= 2^23 (2^52 in float64) is whole already; a smaller one goes through int64,
// and a zero result keeps x's sign (trunc(-0.5) = -0). No gradient reaches x, as in PyTorch.
Tensor Tensor::trunc(Loc loc) const {
    check_defined(*this, "trunc", loc);
    if (!dtype_is_float(dtype())) return *this;
    UserLocScope at(loc);   // for the operators below
    Tensor x = detach();
    Tensor t = x.cast(DType::INT64, loc).cast(dtype(), loc);
    Tensor signed_t = where(t == 0, mul_c(x, 0, loc), t, loc);
    return where(x.abs(loc) < (dtype() == DType::FLOAT32 ? 8388608.0 : 4503599627370496.0),
                 signed_t, x, loc);
}
Tensor Tensor::floor(Loc loc) const {
    check_defined(*this, "floor", loc);
    if (!dtype_is_float(dtype())) return *this;
    Tensor t = trunc(loc);
    return where(t > detach(), add_c(t, -1, loc), t, loc);
}
Tensor Tensor::ceil(Loc loc) const {
    check_defined(*this, "ceil", loc);
    if (!dtype_is_float(dtype())) return *this;
    Tensor t = trunc(loc);
    return where(t < detach(), add_c(t, 1, loc), t, loc);
}
// f = floor x and d = x - f (exact: |x| < 2^23 has bits below the point, a larger x is whole
// and d is 0); up where d > 1/2, or d = 1/2 and f is odd (f/2 not whole)
Tensor Tensor::round(Loc loc) const {
    check_defined(*this, "round", loc);
    if (!dtype_is_float(dtype())) return *this;
    UserLocScope at(loc);   // for the operators below
    Tensor x = detach(), f = x.floor(loc), d = x - f;
    Tensor half = mul_c(f, 0.5, loc), odd = half.floor(loc) != half;
    Tensor r = where((d > 0.5).maximum((d == 0.5).minimum(odd, loc), loc), add_c(f, 1, loc), f,
                     loc);
    return where(r == 0, mul_c(x, 0, loc), r, loc);
}
Tensor Tensor::tan(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "tan", loc), loc);
    return x.sin(loc) / x.cos(loc);
}
// Odd functions work on a = s·x, s = ±1 the sign of x (1 at 0, and at -0, so that a keeps its
// zero's sign), so that their gradient at 0 is not |x|'s 0. A branch that where() does not take
// still gets a zero gradient, and 0·∞ is NaN: each branch reads x only where it is taken.
//
// atan a for a >= 0: 1/a above 1 (then π/2 less), (√3·a - 1)/(a + √3) above tan(π/12) (then
// π/6 more), leaving |a| <= 0.268, where the series Σ (-1)^k a^(2k+1)/(2k+1) is below an ulp
// after 7 terms in float32, 15 in float64.
Tensor Tensor::atan(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "atan", loc), loc), s = sign_pm1(x, loc);
    Tensor a = x * s;
    Tensor inverted = a > 1;
    a = where(inverted, where(inverted, a, 1.0, loc).reciprocal(loc), a, loc);
    Tensor shifted = a > 0.2679491924311227;
    const double root3 = std::sqrt(3.0);
    Tensor a_shifted = where(shifted, a, 0.0, loc);
    a = where(shifted, (a_shifted * root3 - 1.0) / (a_shifted + root3), a, loc);
    Tensor z = a * a;
    int last = x.dtype() == DType::FLOAT32 ? 7 : 15;
    auto term = [](int k) { return (k % 2 ? -1.0 : 1.0) / (2 * k + 1); };
    Tensor series = const_like(z, term(last), z.dtype(), loc);
    for (int k = last - 1; k >= 0; k--) series = series * z + term(k);
    Tensor r = a * series;
    r = where(shifted, r + PI / 6, r, loc);
    return where(inverted, PI / 2 - r, r, loc) * s;
}
// asin u = atan(u/√(1 - u²)) for |u| <= 1/2; asin a = π/2 - 2·asin √((1 - a)/2) above, whose
// root is at most 1/2 and exact near a = 1 (acos alike)
static Tensor asin_near_0(const Tensor& u, Loc loc) {
    return (u / ((1.0 - u) * (1.0 + u)).sqrt(loc)).atan(loc);
}
Tensor Tensor::asin(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "asin", loc), loc), s = sign_pm1(x, loc);
    Tensor a = x * s, near_0 = a <= 0.5;
    Tensor inner = asin_near_0(where(near_0, a, 0.0, loc), loc);
    Tensor outer = PI / 2 - 2.0 * asin_near_0(((1.0 - where(near_0, 1.0, a, loc)) * 0.5).sqrt(loc),
                                              loc);
    return where(near_0, inner, outer, loc) * s;
}
// π/2 - asin x for |x| <= 1/2; 2·asin √((1 - x)/2) above, π less that of -x below
Tensor Tensor::acos(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "acos", loc), loc), near_0 = x.abs(loc) <= 0.5;
    Tensor inner = PI / 2 - asin_near_0(where(near_0, x, 0.0, loc), loc);
    Tensor a = where(near_0, 1.0, x, loc), s = sign_pm1(a, loc);
    Tensor half = 2.0 * asin_near_0(((1.0 - a * s) * 0.5).sqrt(loc), loc);
    return where(near_0, inner, where(a < 0, PI - half, half, loc), loc);
}
// whether x's sign bit is set: x < 0, or x is -0 (1/x is -∞); NaN: no. A comparison passes
// no gradient, so the ∞ of 1/0 reaches none.
static Tensor sign_bit(const Tensor& x, Loc loc) {
    return (x < 0).maximum(x.reciprocal(loc) < 0, loc);
}
// C's atan2: where |y| > |x|, ±π/2 - atan(x/y); else atan(y/x), and ±π more where x's sign bit
// is set (the sign of y's). Both infinite: the angle of their signs.
Tensor Tensor::atan2(const Tensor& other, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    auto [y0, x0] = operands(*this, other, "atan2", loc, true);
    Tensor both_infinite = y0.isinf(loc).minimum(x0.isinf(loc), loc);
    Tensor y = where(both_infinite, sign_pm1(y0, loc), y0, loc);
    Tensor x = where(both_infinite, sign_pm1(x0, loc), x0, loc);
    Tensor steep = y.abs(loc) > x.abs(loc), y_below = sign_bit(y, loc);
    Tensor x_side = where(steep, y_below.cast(y.dtype(), loc) * -PI + PI / 2, 0.0, loc);
    Tensor across = (x / where(steep, y, 1.0, loc)).atan(loc);
    Tensor along = (y / where(steep.maximum(x == 0, loc), 1.0, x, loc)).atan(loc);
    Tensor turned = where(y_below, along - PI, along + PI, loc);
    return where(steep, x_side - across, where(sign_bit(x, loc), turned, along, loc), loc);
}
// sinh x = (u + u/(u + 1))/2 with u = e^x - 1 for |x| < 1 (no cancellation), else (e^x - e^-x)/2
Tensor Tensor::sinh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "sinh", loc), loc), small = x.abs(loc) < 1;
    Tensor u = where(small, x, 0.0, loc).expm1(loc), xl = where(small, 1.0, x, loc);
    return where(small, (u + u / (u + 1.0)) * 0.5, (xl.exp(loc) - (-xl).exp(loc)) * 0.5, loc);
}
// cosh x = 1 + 2·sinh²(x/2): its gradient, sinh x, keeps its precision near 0
Tensor Tensor::cosh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor half = as_float(check_defined(*this, "cosh", loc), loc) * 0.5;
    Tensor s = half.sinh(loc);
    return s * s * 2.0 + 1.0;
}
// asinh a = ln(1 + a + a²/(1 + √(1 + a²))), exact near 0; ln a + ln 2 once a² would overflow.
// asinh and atanh give x itself at 0 (its sign kept, its gradient 1).
Tensor Tensor::asinh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "asinh", loc), loc), s = sign_pm1(x, loc);
    Tensor a = x * s, huge = a > 1e18;
    Tensor small = where(huge, 1.0, a, loc), large = where(huge, a, 1.0, loc);
    Tensor near = (small + small * small / ((small * small + 1.0).sqrt(loc) + 1.0)).log1p(loc);
    return where(x == 0, x, where(huge, large.log(loc) + LN2, near, loc) * s, loc);
}
// acosh x = ln(1 + d + √d·√(d + 2)) with d = x - 1, exact near 1 (NaN below); ln x + ln 2 for
// huge x
Tensor Tensor::acosh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "acosh", loc), loc), huge = x > 1e18;
    Tensor d = where(huge, 1.0, x, loc) - 1.0, large = where(huge, x, 1.0, loc);
    Tensor near = (d + d.sqrt(loc) * (d + 2.0).sqrt(loc)).log1p(loc);
    return where(huge, large.log(loc) + LN2, near, loc);
}
// atanh x = (ln(1 + x) - ln(1 - x))/2: no cancellation, and ±∞ with gradient ∞ at ±1
Tensor Tensor::atanh(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "atanh", loc), loc);
    return where(x == 0, x, (x.log1p(loc) - (-x).log1p(loc)) * 0.5, loc);
}
Tensor Tensor::log10(Loc loc) const { return mul_c(log2(loc), std::log10(2.0), loc); }
Tensor Tensor::xlogy(const Tensor& other, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    auto [x, y] = operands(*this, other, "xlogy", loc, true);
    Tensor zero_by_rule = (x == 0).minimum(y <= 0, loc);   // 0·ln y would be 0·-∞ or NaN
    return x * where(zero_by_rule, 1.0, y, loc).log(loc);
}
Tensor Tensor::logit(std::optional<double> eps, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "logit", loc), loc);
    if (eps) x = x.clamp(*eps, 1 - *eps, loc);
    return x.log(loc) - (-x).log1p(loc);
}
// erf below |x| = 1/2 by its series (2/√π)·Σ (-1)^k x^(2k+1)/(k!(2k+1)), below an ulp after 6
// terms in float32, 12 in float64
static Tensor erf_near_0(const Tensor& x, Loc loc) {
    int last = x.dtype() == DType::FLOAT32 ? 6 : 12;
    auto term = [](int k) {
        double factorial = 1;
        for (int i = 2; i <= k; i++) factorial *= i;
        return (k % 2 ? -1.0 : 1.0) / (factorial * (2 * k + 1));
    };
    Tensor z = x * x, series = const_like(x, term(last), x.dtype(), loc);
    for (int k = last - 1; k >= 0; k--) series = series * z + term(k);
    return x * series * (2 / std::sqrt(PI));
}
// erfc a for a >= 1/2: t·e^(P - a²), t = 1/(1 + a/2) in (0, 0.8], P a Chebyshev series in
// u = 2.5t - 1 fitted (for this project, to values of 60 digits) to ln(erfc(a)·e^(a²)/t):
// relative error 3e-15 with its 21 terms, 8e-9 with the first 11, float32's
static Tensor erfc_beyond_half(const Tensor& a, Loc loc) {
    static const double chebyshev[21] = {
        -0.78318707272405941, 0.505894793317341, 0.020165332295700576, -0.0041507842704837598,
        -0.00069293930331306363, 8.0613044480826149e-05, 2.5850999510726438e-05,
        -2.4532413616384918e-06, -1.0665628951134214e-06, 1.0956136221595969e-07,
        4.6182837598607291e-08, -6.3050889564930604e-09, -1.9633312309252888e-09,
        3.9793688726141791e-10, 7.3597100636035693e-11, -2.4619650762502872e-11,
        -1.7696955012524935e-12, 1.3810619314824582e-12, -4.6512793616670749e-14,
        -6.3710148268114346e-14, 9.9475983006413578e-15};
    Tensor b = where(a > 28.0, 28.0, a, loc);   // erfc 28 is 0 in float64: no ∞·0 in gradients
    Tensor t = (b * 0.5 + 1.0).reciprocal(loc), u2 = t * 5.0 - 2.0;   // 2u
    // Clenshaw: b_k = 2u·b_(k+1) - b_(k+2) + c_k, P = c_0 + u·b_1 - b_2
    Tensor b1 = const_like(t, 0, t.dtype(), loc), b2 = b1;
    for (int k = a.dtype() == DType::FLOAT32 ? 10 : 20; k >= 1; k--) {
        Tensor next = u2 * b1 - b2 + chebyshev[k];
        b2 = b1, b1 = next;
    }
    Tensor p = u2 * 0.5 * b1 - b2 + chebyshev[0];
    return t * (p - b * b).exp(loc);
}
// Each branch reads x only where it is taken (see atan)
Tensor Tensor::erf(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "erf", loc), loc), s = sign_pm1(x, loc);
    Tensor near_0 = x.abs(loc) < 0.5;
    Tensor far = 1.0 - erfc_beyond_half(where(near_0, 1.0, x * s, loc), loc);
    return where(near_0, erf_near_0(where(near_0, x, 0.0, loc), loc), far * s, loc);
}
// 1 - erf x below 1/2; erfc |x| beyond, and 2 less it below -1/2
Tensor Tensor::erfc(Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    Tensor x = as_float(check_defined(*this, "erfc", loc), loc), s = sign_pm1(x, loc);
    Tensor near_0 = x.abs(loc) < 0.5;
    Tensor tail = erfc_beyond_half(where(near_0, 1.0, x * s, loc), loc);
    Tensor far = where(x < 0, 2.0 - tail, tail, loc);
    return where(near_0, 1.0 - erf_near_0(where(near_0, x, 0.0, loc), loc), far, loc);
}
Tensor Tensor::isnan(Loc loc) const {
    Tensor x = check_defined(*this, "isnan", loc);
    return bin(Op::CMPEQ, x, x, "isnan", loc).logical_not(loc);
}
Tensor Tensor::isinf(Loc loc) const {
    check_defined(*this, "isinf", loc);
    if (!dtype_is_float(dtype())) return const_like(*this, 0, DType::BOOL, loc);
    return bin(Op::CMPEQ, abs(loc), const_like(*this, INFINITY, dtype(), loc), "isinf", loc);
}
Tensor Tensor::isfinite(Loc loc) const {
    check_defined(*this, "isfinite", loc);
    if (!dtype_is_float(dtype())) return const_like(*this, 1, DType::BOOL, loc);
    return bin(Op::CMPLT, abs(loc), const_like(*this, INFINITY, dtype(), loc), "isfinite", loc);
}
Tensor Tensor::nan_to_num(double nan, std::optional<double> posinf,
                          std::optional<double> neginf, Loc loc) const {
    check_defined(*this, "nan_to_num", loc);
    if (!dtype_is_float(dtype())) return *this;
    UserLocScope at(loc);   // for the operators below
    double most = dtype() == DType::FLOAT32 ? double(std::numeric_limits<float>::max())
                                            : std::numeric_limits<double>::max();
    Tensor y = where(isnan(loc), nan, *this, loc);
    y = where(*this == INFINITY, posinf.value_or(most), y, loc);
    return where(*this == -INFINITY, neginf.value_or(-most), y, loc);
}
// x % other, moved back by other where its sign is not x's; a finite x over an infinite other
// is x (% gives other where their signs differ)
Tensor Tensor::fmod(const Tensor& other, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    auto [a, b] = operands(*this, other, "fmod", loc);
    check_not_bool(a, "fmod", loc);
    if (!dtype_is_float(a.dtype())) return wrap(graph_binary(Op::MOD, N(a), N(b), loc));
    Tensor r = Operand(a, loc) % b;
    r = where((r != 0).minimum((r < 0) != (a < 0), loc), r - b, r, loc);
    return where(a.isfinite(loc).minimum(b.isinf(loc), loc), a, r, loc);
}
Tensor Tensor::fmod(Scalar other, Loc loc) const {
    return fmod(scalar_operand(*this, other, "fmod", loc), loc);
}
// Integers: C's quotient, one lower where the remainder's sign is not b's. Floats: PyTorch's
// (a - fmod(a, b))/b, one lower where fmod's sign is not b's, then rounded to the nearest
// whole number (the division may land just off it); a zero quotient keeps a/b's sign
Tensor Tensor::floor_divide(const Tensor& other, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    auto [a, b] = operands(detach(), other.detach(), "floor_divide", loc);
    check_not_bool(a, "floor_divide", loc);
    if (!dtype_is_float(a.dtype())) {
        Tensor q = wrap(graph_binary(Op::DIV, N(a), N(b), loc));
        Tensor r = wrap(graph_binary(Op::MOD, N(a), N(b), loc));
        return q - ((r != 0).minimum((r < 0) != (b < 0), loc)).cast(a.dtype(), loc);
    }
    Tensor m = a.fmod(b, loc), d = (a - m) / b;
    d = where((m != 0).minimum((m < 0) != (b < 0), loc), add_c(d, -1, loc), d, loc);
    Tensor f = d.floor(loc);
    f = where(d - f > 0.5, add_c(f, 1, loc), f, loc);
    Tensor q = a / b;
    return where(b == 0, q, where(d == 0, mul_c(q, 0, loc), f, loc), loc);
}
Tensor Tensor::floor_divide(Scalar other, Loc loc) const {
    return floor_divide(scalar_operand(*this, other, "floor_divide", loc), loc);
}
Tensor Tensor::abs(Loc loc) const {
    check_defined(*this, "abs", loc);
    if (dtype() == DType::BOOL) return *this;
    Tensor m = maximum(neg(*this, loc), loc);
    return dtype_is_float(dtype()) ? add_c(m, 0, loc) : m;
}
Tensor Tensor::maximum(const Tensor& o, Loc loc) const {
    return bin(Op::MAX, *this, o, "maximum", loc);
}
Tensor Tensor::maximum(Scalar o, Loc loc) const {
    return maximum(scalar_operand(*this, o, "maximum", loc), loc);
}
// min(a, b) = r(max(r(a), r(b))), r = reversed_order; for bool, a and b = a·b
Tensor Tensor::minimum(const Tensor& o, Loc loc) const {
    auto [x, y] = operands(*this, o, "minimum", loc);
    if (x.dtype() == DType::BOOL) return mul(x, y, loc);
    return reversed_order(reversed_order(x, loc).maximum(reversed_order(y, loc), loc), loc);
}
Tensor Tensor::minimum(Scalar o, Loc loc) const {
    return minimum(scalar_operand(*this, o, "minimum", loc), loc);
}
Tensor Tensor::logical_not(Loc loc) const {
    check_defined(*this, "logical_not", loc);
    return wrap(graph_binary(Op::CMPEQ, node(), graph_const(0, dtype(), shape(), loc), loc));
}
// x^y = 2^(y·log2|x|) with C's (and PyTorch's) special cases:
// - the sign of x (-0 and -∞ too) is kept for an odd integer y; a finite x < 0 with a
//   fractional y gives NaN;
// - at |x| = 0: 0 for y > 0, ∞ for y < 0 (the logarithm sees 1 there, so the gradients at a
//   zero base are 0 where PyTorch's are ±∞, for y < 1, or NaN); y = 1 gives x, gradient 1;
// - 1 for y = 0 (x ∞ or NaN too), for x = 1 (y NaN too) and for |x| = 1, y = ±∞.
// A float with |y| >= 2^24 (2^53 for float64) is an even integer; a smaller one converts to
// int32 (int64) exactly, which decides "integer" and "odd".
Tensor Tensor::pow(const Tensor& exponent, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    auto [x, y] = operands(*this, exponent, "pow", loc, true);
    DType dt = x.dtype();
    Tensor ax = x.abs(loc), ay = y.abs(loc), zero = ax == 0;
    Tensor one = const_like(x, 1, dt, loc), inf = const_like(x, INFINITY, dt, loc);
    Tensor at_zero = where(y > 0, 0, where(y < 0, inf, one, loc), loc);
    Tensor mag =
        where(zero, at_zero, mul(y, where(zero, one, ax, loc).log2(loc), loc).exp2(loc), loc);
    Tensor big = ay >= (dt == DType::FLOAT32 ? 16777216.0 : 9007199254740992.0);
    DType int_dt = dt == DType::FLOAT32 ? DType::INT32 : DType::INT64;
    Tensor yi = where(big, 0, y, loc).cast(int_dt, loc);
    Tensor is_int = big.maximum(yi.cast(dt, loc) == y, loc);
    NodeP two = graph_const(2, int_dt, yi.shape(), loc);
    Tensor odd = wrap(graph_binary(Op::MOD, N(yi), two, loc)) != 0;
    Tensor signed_mag = where(sign_bit(x, loc).minimum(odd, loc), neg(mag, loc), mag, loc);
    Tensor undefined = (x < 0).minimum(x > -INFINITY, loc).minimum(is_int.logical_not(loc), loc);
    Tensor exactly_one = ((y == 0).minimum((ax < INFINITY).logical_not(loc), loc))
                             .maximum((x == 1).minimum(y != y, loc), loc)
                             .maximum((ax == 1).minimum(ay == INFINITY, loc), loc);
    Tensor result = where(exactly_one, one,
                          where(undefined, const_like(x, NAN, dt, loc), signed_mag, loc), loc);
    // x^1 is x: at a zero base too, where the gradient is then 1, not the 0 above
    return where(zero.minimum(y == 1, loc), x, result, loc);
}
// Whole exponents up to 64 by repeated squaring: exact, integer tensors stay integer (for an
// int exponent), and x^-k = 1/x^k.
Tensor Tensor::pow(Scalar e, Loc loc) const {
    check_defined(*this, "pow", loc);
    if (e.value == std::floor(e.value) && std::fabs(e.value) <= 64 &&
        (e.value >= 0 || e.is_float || dtype_is_float(dtype()))) {
        DType dt = scalar_dtype(dtype(), e);
        Tensor result = const_like(*this, 1, dt, loc), base = cast(dt, loc);
        for (int64_t k = int64_t(std::fabs(e.value)); k > 0; k >>= 1) {
            if (k & 1) result = mul(result, base, loc);
            if (k > 1) base = mul(base, base, loc);
        }
        return e.value < 0 ? result.reciprocal(loc) : result;
    }
    if (e.value == 0.5) return as_float(*this, loc).sqrt(loc);
    return pow(scalar_operand(*this, e, "pow", loc), loc);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc) {
    check_defined(cond, "where", loc), check_defined(a, "where", loc);
    check_defined(b, "where", loc);
    Shape s = broadcast_shape(broadcast_shape(cond.shape(), a.shape(), "where", loc), b.shape(),
                              "where", loc);
    DType dt = promote(a.dtype(), b.dtype());
    Tensor c = cond.cast(DType::BOOL, loc).expand(s, loc);
    return wrap(graph_where(N(c), N(a.cast(dt, loc).expand(s, loc)),
                            N(b.cast(dt, loc).expand(s, loc)), loc));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc) {
    return where(cond, scalar_operand(b, a, "where", loc), b, loc);
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc) {
    return where(cond, a, scalar_operand(a, b, "where", loc), loc);
}

// -- reductions
Tensor Tensor::sum(Loc loc) const { return sum(std::vector<int>{}, false, loc).reshape({}, loc); }
Tensor Tensor::sum(int axis, bool keepdim, Loc loc) const {
    return sum(std::vector<int>{axis}, keepdim, loc);
}
// Integers and bools are summed in int64, as in PyTorch (int32 sums overflow soon).
Tensor Tensor::sum(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    Tensor x = dtype_is_float(check_defined(*this, "sum", loc).dtype()) ? *this
                                                                       : cast(DType::INT64, loc);
    return reduce(Op::REDUCE_SUM, x, axes, axes.empty(), keepdim, "sum", loc);
}
Tensor Tensor::mean(Loc loc) const { return mean(std::vector<int>{}, false, loc).reshape({}, loc); }
Tensor Tensor::mean(int axis, bool keepdim, Loc loc) const {
    return mean(std::vector<int>{axis}, keepdim, loc);
}
// mean = sum / (number of elements reduced)
Tensor Tensor::mean(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    normalize_axes(axes, check_defined(*this, "mean", loc).shape(), "mean", loc);
    Tensor x = as_float(*this, loc);
    Tensor s = x.sum(axes, keepdim, loc);
    double count = double(numel()) / double(std::max<int64_t>(1, s.numel()));
    if (numel() == 0) count = 0;
    return mul_c(s, 1 / count, loc);
}
Tensor Tensor::max(Loc loc) const { return max(std::vector<int>{}, false, loc).reshape({}, loc); }
// the elements of x at indices along axis (its gradient goes there alone); indices from
// argmax or argmin with keepdim as given. max and min build their values first all the same,
// so that a bad axis is named in their own words.
static Tensor at_indices(const Tensor& x, int axis, const Tensor& indices, bool keepdim,
                         Loc loc) {
    if (x.ndim() == 0) return x;
    Tensor picked = x.gather(axis, keepdim ? indices : indices.unsqueeze(axis, loc), loc);
    return keepdim ? picked : picked.squeeze(axis, loc);
}
ValuesIndices Tensor::max(int axis, bool keepdim, Loc loc) const {
    Tensor values = max(std::vector<int>{axis}, keepdim, loc), indices = argmax(axis, keepdim, loc);
    return {tracks_grad() ? at_indices(*this, axis, indices, keepdim, loc) : values, indices};
}
Tensor Tensor::max(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    return reduce(Op::REDUCE_MAX, *this, axes, axes.empty(), keepdim, "max", loc);
}
Tensor Tensor::min(Loc loc) const { return min(std::vector<int>{}, false, loc).reshape({}, loc); }
ValuesIndices Tensor::min(int axis, bool keepdim, Loc loc) const {
    Tensor values = min(std::vector<int>{axis}, keepdim, loc), indices = argmin(axis, keepdim, loc);
    return {tracks_grad() ? at_indices(*this, axis, indices, keepdim, loc) : values, indices};
}
// min x = r(max(r(x))), r = reversed_order; for bool, not max(not x)
Tensor Tensor::min(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    check_defined(*this, "min", loc);
    std::vector<int> reduced = axes;   // none: all
    for (int i = 0; axes.empty() && i < ndim(); i++) reduced.push_back(i);
    check_not_empty(shape(), normalize_axes(reduced, shape(), "min", loc), "min", loc);
    if (dtype() == DType::BOOL) return logical_not(loc).max(axes, keepdim, loc).logical_not(loc);
    return reversed_order(reversed_order(*this, loc).max(axes, keepdim, loc), loc);
}
Tensor Tensor::argmax(Loc loc) const {
    return check_defined(*this, "argmax", loc).flatten(0, -1, loc).argmax(0, false, loc);
}
// The first index of the maximum (or of the first NaN, which is the maximum then):
// n - max over the axis of (x == max or x is NaN ? n - i : 0)
Tensor Tensor::argmax(int axis, bool keepdim, Loc loc) const {
    check_defined(*this, "argmax", loc);
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, shape().size(), "argmax", shape(), loc);
    check_not_empty(shape(), {ax}, "argmax", loc);
    int64_t n = ndim() == 0 ? 1 : shape()[size_t(ax)];
    Tensor x = ndim() == 0 ? reshape({1}, loc) : *this;
    Shape along(x.shape().size(), 1);
    along[size_t(ax)] = n;
    Tensor rev = add_c(neg(arange(n, loc), loc), double(n), loc).reshape(along, loc);
    Tensor best = x.max(std::vector<int>{ax}, true, loc);
    Tensor hit = where((x == best).maximum(x != x, loc), rev, 0, loc);
    Tensor idx = add_c(neg(hit.max(std::vector<int>{ax}, keepdim, loc), loc), double(n), loc)
                     .cast(DType::INT64, loc);
    return ndim() == 0 ? idx.reshape({}, loc) : idx;
}

// The first index of the minimum: the argmax of reversed_order(x)
Tensor Tensor::argmin(Loc loc) const {
    return check_defined(*this, "argmin", loc).flatten(0, -1, loc).argmin(0, false, loc);
}
Tensor Tensor::argmin(int axis, bool keepdim, Loc loc) const {
    check_defined(*this, "argmin", loc);
    if (dtype() == DType::BOOL) return logical_not(loc).argmax(axis, keepdim, loc);
    return reversed_order(*this, loc).argmax(axis, keepdim, loc);
}
// x's order as (tier, key), compared tier first: a float's NaN is tier 1 (above +∞) with
// key 0, the rest tier 0 with key x (no gradient); an integer's key is x in int64. reversed:
// the order turned around (keys reversed_order, NaN tier -1)
static std::pair<Tensor, Tensor> ordered_keys(const Tensor& x, bool reversed, Loc loc) {
    Tensor key = dtype_is_float(x.dtype()) ? x.detach() : x.cast(DType::INT64, loc);
    if (reversed) key = reversed_order(key, loc);
    if (!dtype_is_float(x.dtype())) return {const_like(key, 0, DType::INT32, loc), key};
    Tensor nan = key != key;
    return {where(nan, reversed ? -1 : 1, const_like(nan, 0, DType::INT32, loc), loc),
            where(nan, 0, key, loc)};
}
// Round i takes, of the elements not taken yet, the first with the largest key. A float's key is
// (tier, value): NaN has tier 1 for the largest (above +∞) and -1 for the smallest (after +∞).
// The values are gathered from x, so the gradient goes to the elements picked.
ValuesIndices Tensor::topk(int64_t k, int axis, bool largest, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, shape().size(), "topk", shape(), loc);
    int64_t n = ndim() == 0 ? 1 : shape()[size_t(ax)];
    if (k < 0 || k > n)
        fail(strf("topk: k = %lld is not in [0, %lld] for shape %s along axis %d", (long long)k,
                  (long long)n, shape_str(shape()).c_str(), ax), loc);
    Tensor x = ndim() == 0 ? reshape({1}, loc) : *this;
    Shape along(x.shape().size(), 1);
    along[size_t(ax)] = n;
    std::vector<int> axes{ax};
    Tensor position = arange(n, loc).reshape(along, loc);
    Tensor rev = add_c(neg(position, loc), double(n), loc);
    bool is_float = dtype_is_float(dtype());
    auto [tier, key] = ordered_keys(x, !largest, loc);
    double lowest = is_float ? -INFINITY : double(INT64_MIN);
    Tensor taken = const_like(x, 0, DType::BOOL, loc);
    std::vector<Tensor> picked;
    for (int64_t i = 0; i < k; i++) {
        Tensor open = taken.logical_not(loc);
        if (is_float) {
            Tensor top_tier = where(open, tier, -2, loc).max(axes, true, loc);
            open = open.minimum(tier == top_tier, loc);
        }
        Tensor best = where(open, key, const_like(key, lowest, key.dtype(), loc), loc)
                          .max(axes, true, loc);
        Tensor first = where(open.minimum(key == best, loc), rev, 0, loc).max(axes, true, loc);
        Tensor idx = add_c(neg(first, loc), double(n), loc);
        picked.push_back(idx);
        taken = taken.maximum(position == idx, loc);
    }
    Shape out = x.shape();
    out[size_t(ax)] = k;
    Tensor indices = k == 0 ? Tensor::zeros(out, DType::INT64, loc)
                            : cat(picked, ax, loc).cast(DType::INT64, loc);
    Tensor values = x.gather(ax, indices, loc);
    if (ndim() == 0) return {values.reshape({}, loc), indices.reshape({}, loc)};
    return {values, indices};
}

// Each element of the row (the axis moved last, padded to 2^k) carries its tier (0, NaN 1,
// padding 2), its key (NaN: 0) and its index; (tier, key, index) orders them with no ties.
// Pass (size, half) of the network pairs element i with i ^ half, by viewing the row as
// [2^k / (2·half), 2, half] and flipping the middle axis; the first of a pair keeps the
// smaller where i & size is 0 (an ascending block), the larger elsewhere. The values are
// then x gathered at the indices, so the gradient goes back to where each value came from.
ValuesIndices Tensor::sort(int axis, bool descending, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, shape().size(), "sort", shape(), loc);
    Tensor x = ndim() == 0 ? reshape({1}, loc) : transpose(ax, -1, loc);
    const int64_t n = x.size(-1);
    int64_t width = 1;
    while (width < n) width *= 2;
    std::vector<std::pair<int64_t, int64_t>> tail(size_t(x.ndim()), {0, 0});
    tail.back() = {0, width - n};
    auto [tier, key] = ordered_keys(x, descending, loc);
    tier = tier.pad(tail, 2, loc);
    key = key.pad(tail, 0, loc);
    Shape row_shape = key.shape();
    Tensor index = Tensor::arange(width, loc).cast(DType::INT64, loc).expand(row_shape, loc);
    for (int64_t size = 2; size <= width; size *= 2)
        for (int64_t half = size / 2; half >= 1; half /= 2) {
            Shape pairs(row_shape.begin(), row_shape.end() - 1);
            for (int64_t d : {width / (2 * half), int64_t(2), half}) pairs.push_back(d);
            auto paired = [&](const Tensor& t) {
                Tensor mine = t.reshape(pairs, loc);
                return std::pair<Tensor, Tensor>{mine, mine.flip(-2, loc)};
            };
            auto [tier_a, tier_b] = paired(tier);
            auto [key_a, key_b] = paired(key);
            auto [index_a, index_b] = paired(index);
            Tensor below = tier_a < tier_b;
            below = below.maximum((tier_a == tier_b).minimum(
                (key_a < key_b).maximum((key_a == key_b).minimum(index_a < index_b, loc), loc),
                loc), loc);
            // block b of pairs starts at i = b·2·half: bit `size` of i is bit `blocks` of b
            const int64_t blocks = size / (2 * half);
            Tensor block = Tensor::arange(width / (2 * half), loc).reshape({-1, 1, 1}, loc);
            Tensor ascending = block % (2 * blocks) < blocks;
            Tensor first = Tensor::arange(2, loc).reshape({2, 1}, loc) == 0;
            Tensor keep = below == (first == ascending);
            // stored after each pass: inlined, a pass would compute the ones before it for
            // each of its two reads (2^passes times over)
            tier = where(keep, tier_a, tier_b, loc).reshape(row_shape, loc).contiguous(loc);
            key = where(keep, key_a, key_b, loc).reshape(row_shape, loc).contiguous(loc);
            index = where(keep, index_a, index_b, loc).reshape(row_shape, loc).contiguous(loc);
        }
    Tensor order = index.slice(-1, 0, n, 1, loc);
    Tensor values = x.gather(-1, order, loc);
    if (ndim() == 0) return {values.reshape({}, loc), order.reshape({}, loc)};
    return {values.transpose(ax, -1, loc), order.transpose(ax, -1, loc)};
}
Tensor Tensor::argsort(int axis, bool descending, Loc loc) const {
    return sort(axis, descending, loc).indices;
}
// The element at position(sorted order, NaN count) of each sorted row along the axis, and its
// index; the position keeps the axis, as a size-1 index
template <typename Position>
static ValuesIndices sorted_pick(const Tensor& x, int axis, bool keepdim, const char* op,
                                 Position position, Loc loc) {
    check_defined(x, op, loc);
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, x.shape().size(), op, x.shape(), loc);
    check_not_empty(x.shape(), {ax}, op, loc);
    if (x.ndim() == 0) return {x, const_like(x, 0, DType::INT64, loc)};
    Tensor order = x.argsort(ax, false, loc), nans = (x != x).sum(ax, true, loc);
    Tensor indices = order.gather(ax, position(nans, x.size(ax)), loc);
    Tensor values = x.gather(ax, indices, loc);
    if (keepdim) return {values, indices};
    return {values.squeeze(ax, loc), indices.squeeze(ax, loc)};
}
Tensor Tensor::median(Loc loc) const {
    check_defined(*this, "median", loc);
    return flatten(0, -1, loc).median(0, false, loc).values.reshape({}, loc);
}
// the middle position, or that of the first NaN (NaN sort last, in their order)
ValuesIndices Tensor::median(int axis, bool keepdim, Loc loc) const {
    auto middle = [&](const Tensor& nans, int64_t n) {
        return where(nans > 0, neg(nans, loc) + n, (n - 1) / 2, loc).cast(DType::INT64, loc);
    };
    return sorted_pick(*this, axis, keepdim, "median", middle, loc);
}
ValuesIndices Tensor::kthvalue(int64_t k, int axis, bool keepdim, Loc loc) const {
    check_defined(*this, "kthvalue", loc);
    int64_t n = ndim() == 0 ? 1 : size(normalize_axis(axis, shape().size(), "kthvalue", shape(),
                                                      loc));
    if (k < 1 || k > n)
        fail(strf("kthvalue: k = %lld is not in [1, %lld] for shape %s along axis %d",
                  (long long)k, (long long)n, shape_str(shape()).c_str(), axis), loc);
    auto kth = [&](const Tensor& nans, int64_t) {
        return const_like(nans, double(k - 1), DType::INT64, loc);
    };
    return sorted_pick(*this, axis, keepdim, "kthvalue", kth, loc);
}

// Along the last axis: a row of up to 256 sums a triangle of x (n² work); a longer row is cut
// into blocks of 256, each block's cumsum plus the sum of the blocks before it (n·256 work).
static Tensor cumsum_last(const Tensor& x, Loc loc) {
    UserLocScope at(loc);   // for the operators below
    const int64_t block = 256;
    int64_t n = x.shape().back();
    if (n <= block) {
        Tensor i = Tensor::arange(n, loc);
        Tensor lower = i.reshape({1, n}, loc) <= i.reshape({n, 1}, loc);   // [i, j]: j <= i
        return where(lower, x.unsqueeze(-2, loc), 0, loc).sum(-1, false, loc);
    }
    int64_t m = (n + block - 1) / block;
    std::vector<std::pair<int64_t, int64_t>> pads(x.shape().size(), {0, 0});
    pads.back() = {0, m * block - n};
    Shape blocks = x.shape(), flat = x.shape();
    blocks.back() = m;
    blocks.push_back(block);
    flat.back() = m * block;
    Tensor inner = cumsum_last(x.pad(pads, 0, loc).reshape(blocks, loc), loc);
    Tensor totals = inner.slice(-1, block - 1, block, 1, loc).squeeze(-1, loc);
    pads.back() = {1, 0};   // the sum of the blocks before: shifted one block on
    Tensor before = cumsum_last(totals, loc).pad(pads, 0, loc).slice(-1, 0, m, 1, loc);
    return add(inner, before.unsqueeze(-1, loc), loc).reshape(flat, loc).slice(-1, 0, n, 1, loc);
}
Tensor Tensor::cumsum(int axis, Loc loc) const {
    check_defined(*this, "cumsum", loc);
    int ax = normalize_axis(axis, shape().size(), "cumsum", shape(), loc);
    if (ndim() == 0) return dtype_is_float(dtype()) ? *this : cast(DType::INT64, loc);
    Tensor x = dtype_is_float(dtype()) ? *this : cast(DType::INT64, loc);
    return cumsum_last(x.transpose(ax, -1, loc), loc).transpose(ax, -1, loc);
}

Tensor Tensor::cumprod(int axis, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, shape().size(), "cumprod", shape(), loc);
    Tensor x = dtype_is_float(dtype()) ? *this : cast(DType::INT64, loc);
    if (ndim() == 0) return x;
    Tensor row = x.transpose(ax, -1, loc);
    const int64_t n = row.size(-1);
    std::vector<std::pair<int64_t, int64_t>> ones(size_t(ndim()), {0, 0});
    for (int64_t shift = 1; shift < n; shift *= 2) {
        ones.back() = {shift, 0};
        // stored after each pass: inlined, each pass would compute the ones before it twice
        row = (row * row.pad(ones, 1, loc).slice(-1, 0, n, 1, loc)).contiguous(loc);
    }
    return row.transpose(ax, -1, loc);
}

// A scan along the last axis of row: log2 n passes, each combining every element with the one
// shift before it (the first shift elements have none and keep theirs), stored after each
// pass (inlined, a pass would compute the ones before it twice). combine(later, earlier,
// has_earlier) gives the new row.
template <typename Combine>
static Tensor scan_last(const Tensor& row, Combine combine, Loc loc) {
    const int64_t n = row.size(-1);
    Tensor position = Tensor::arange(n, loc), result = row;
    std::vector<std::pair<int64_t, int64_t>> shifted(size_t(row.ndim()), {0, 0});
    for (int64_t shift = 1; shift < n; shift *= 2) {
        shifted.back() = {shift, 0};
        auto earlier = [&](const Tensor& t) {
            return t.pad(shifted, 0, loc).slice(-1, 0, n, 1, loc);
        };
        result = combine(result, earlier, position >= shift).contiguous(loc);
    }
    return result;
}
// The scan of (value, index) pairs: the later wins where it is NaN or, the earlier not NaN, at
// least (largest) or at most the earlier; the index rides along in a second row of the scan.
static ValuesIndices running_extreme(const Tensor& self, int axis, bool largest, const char* op,
                                     Loc loc) {
    check_defined(self, op, loc);
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, self.shape().size(), op, self.shape(), loc);
    if (self.ndim() == 0) return {self, const_like(self, 0, DType::INT64, loc)};
    Tensor row = self.detach().transpose(ax, -1, loc);
    const int64_t n = row.size(-1);
    Tensor index = Tensor::arange(n, loc).cast(DType::INT64, loc).expand(row.shape(), loc);
    // float64 holds every float32, bool and index exactly; integers stay exact in int64
    bool whole = !dtype_is_float(self.dtype()) && self.dtype() != DType::BOOL;
    DType key = whole ? DType::INT64 : DType::FLOAT64;
    Tensor pairs = stack({row.cast(key, loc), index.cast(key, loc)}, 0, loc);
    auto combine = [&](const Tensor& now, auto earlier, const Tensor& has_earlier) {
        Tensor before = earlier(now);
        Tensor v = now.slice(0, 0, 1, 1, loc), e = before.slice(0, 0, 1, 1, loc);
        Tensor wins = largest ? v >= e : v <= e;
        if (dtype_is_float(self.dtype())) wins = (v != v).maximum((e == e).minimum(wins, loc), loc);
        return where(wins.maximum(has_earlier.logical_not(loc), loc), now, before, loc);
    };
    Tensor indices = scan_last(pairs, combine, loc).slice(0, 1, 2, 1, loc).squeeze(0, loc)
                         .cast(DType::INT64, loc).transpose(ax, -1, loc);
    return {self.gather(ax, indices, loc), indices};
}
ValuesIndices Tensor::cummax(int axis, Loc loc) const {
    return running_extreme(*this, axis, true, "cummax", loc);
}
ValuesIndices Tensor::cummin(int axis, Loc loc) const {
    return running_extreme(*this, axis, false, "cummin", loc);
}
Tensor Tensor::logcumsumexp(int axis, Loc loc) const {
    check_defined(*this, "logcumsumexp", loc);
    int ax = normalize_axis(axis, shape().size(), "logcumsumexp", shape(), loc);
    Tensor x = as_float(*this, loc);
    if (ndim() == 0) return x;
    auto combine = [&](const Tensor& now, auto earlier, const Tensor& has_earlier) {
        return where(has_earlier, logaddexp(now, earlier(now), loc), now, loc);
    };
    return scan_last(x.transpose(ax, -1, loc), combine, loc).transpose(ax, -1, loc);
}

Tensor Tensor::logsumexp(int axis, bool keepdim, Loc loc) const {
    return logsumexp(std::vector<int>{axis}, keepdim, loc);
}
// m + ln Σ e^(x - m) with m the largest, detached as in softmax; an infinite m is taken as 0
// (all -∞: ln 0 = -∞; a +∞: ∞), and nothing to reduce gives ln 0 = -∞, as PyTorch's
Tensor Tensor::logsumexp(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    UserLocScope at(loc);
    Tensor x = as_float(*this, loc);
    if (x.numel() == 0) return x.exp(loc).sum(axes, keepdim, loc).log(loc);
    Tensor m = x.max(axes, true, loc).detach();
    m = where(m.abs(loc) == INFINITY, 0, m, loc);
    Tensor sum = (x - m).exp(loc).sum(axes, keepdim, loc);
    return add(sum.log(loc), m.reshape(sum.shape(), loc), loc);
}
Tensor Tensor::prod(Loc loc) const {
    check_defined(*this, "prod", loc);
    return (ndim() == 0 ? *this : flatten(0, -1, loc).prod(0, false, loc)).reshape({}, loc);
}
Tensor Tensor::prod(int axis, bool keepdim, Loc loc) const {
    check_defined(*this, "prod", loc);
    UserLocScope at(loc);   // for the operators below
    int ax = normalize_axis(axis, shape().size(), "prod", shape(), loc);
    Tensor x = dtype_is_float(dtype()) ? *this : cast(DType::INT64, loc);
    if (ndim() == 0) return x;
    Tensor row = x.transpose(ax, -1, loc);   // the axis last, padded with ones to 2^k
    int64_t n = row.size(-1), width = 1;
    while (width < n) width *= 2;
    std::vector<std::pair<int64_t, int64_t>> ones(size_t(ndim()), {0, 0});
    ones.back() = {0, width - n};
    row = row.pad(ones, 1, loc);
    for (; width > 1; width /= 2)
        row = row.slice(-1, 0, width / 2, 1, loc) * row.slice(-1, width / 2, width, 1, loc);
    Tensor y = row.transpose(ax, -1, loc);
    return keepdim ? y : y.squeeze(ax, loc);
}
// Counts, not max and min: over nothing they give false and true, as PyTorch's
Tensor Tensor::any(Loc loc) const { return any(std::vector<int>{}, false, loc); }
Tensor Tensor::any(int axis, bool keepdim, Loc loc) const {
    return any(std::vector<int>{axis}, keepdim, loc);
}
Tensor Tensor::any(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    UserLocScope at(loc);
    return (*this != 0).sum(axes, keepdim, loc) > 0;
}
Tensor Tensor::all(Loc loc) const { return all(std::vector<int>{}, false, loc); }
Tensor Tensor::all(int axis, bool keepdim, Loc loc) const {
    return all(std::vector<int>{axis}, keepdim, loc);
}
Tensor Tensor::all(const std::vector<int>& axes, bool keepdim, Loc loc) const {
    UserLocScope at(loc);
    return (*this == 0).sum(axes, keepdim, loc) == 0;
}
Tensor logical_and(const Tensor& a, const Tensor& b, Loc loc) {
    UserLocScope at(loc);
    return (a != 0).minimum(b != 0, loc);
}
Tensor logical_or(const Tensor& a, const Tensor& b, Loc loc) {
    UserLocScope at(loc);
    return (a != 0).maximum(b != 0, loc);
}
Tensor logical_xor(const Tensor& a, const Tensor& b, Loc loc) {
    UserLocScope at(loc);
    return (a != 0) != (b != 0);
}

Tensor Tensor::var(Loc loc) const { return var(std::vector<int>{}, 1, false, loc); }
Tensor Tensor::var(int axis, int64_t correction, bool keepdim, Loc loc) const {
    return var(std::vector<int>{axis}, correction, keepdim, loc);
}
// n - correction <= 0 divides by 0 (inf, or NaN for a sum of 0), as in PyTorch
Tensor Tensor::var(const std::vector<int>& axes, int64_t correction, bool keepdim,
                   Loc loc) const {
    check_defined(*this, "var", loc);
    std::vector<int> all = axes;
    for (int i = 0; axes.empty() && i < ndim(); i++) all.push_back(i);
    normalize_axes(all, shape(), "var", loc);
    Tensor x = as_float(*this, loc);
    Tensor d = add(x, neg(x.mean(all, true, loc), loc), loc);
    Tensor s = mul(d, d, loc).sum(all, keepdim, loc);
    double n = double(numel()) / double(std::max<int64_t>(1, s.numel()));
    if (numel() == 0) n = 0;
    return mul_c(s, 1 / std::max(0.0, n - double(correction)), loc);
}
// √var, whose gradient is 0 where var is 0, as PyTorch's std (√'s would be ∞ there, times 0):
// the root of 1 there, and 0 in its place
static Tensor deviation_of(const Tensor& var, Loc loc) {
    Tensor zero = var == 0;
    return where(zero, 0, where(zero, 1, var, loc).sqrt(loc), loc);
}
Tensor Tensor::std(Loc loc) const { return deviation_of(var(loc), loc); }
Tensor Tensor::std(int axis, int64_t correction, bool keepdim, Loc loc) const {
    return deviation_of(var(axis, correction, keepdim, loc), loc);
}
Tensor Tensor::std(const std::vector<int>& axes, int64_t correction, bool keepdim,
                   Loc loc) const {
    return deviation_of(var(axes, correction, keepdim, loc), loc);
}
Tensor Tensor::norm(double p, Loc loc) const { return norm(p, std::vector<int>{}, false, loc); }
Tensor Tensor::norm(double p, int axis, bool keepdim, Loc loc) const {
    return norm(p, std::vector<int>{axis}, keepdim, loc);
}
// The root of a zero sum is taken of 1 and replaced by 0, as in std: its gradient is 0 there.
Tensor Tensor::norm(double p, const std::vector<int>& axes, bool keepdim, Loc loc) const {
    if (!(p > 0)) fail(strf("norm: p must be > 0 or INFINITY, got %g", p), loc);
    UserLocScope at(loc);
    Tensor x = as_float(*this, loc);
    if (p == INFINITY) return x.abs(loc).max(axes, keepdim, loc);
    if (p == 1) return x.abs(loc).sum(axes, keepdim, loc);
    if (p == 2) return deviation_of(mul(x, x, loc).sum(axes, keepdim, loc), loc);
    Tensor sum = x.abs(loc).pow(p, loc).sum(axes, keepdim, loc), zero = sum == 0;
    return where(zero, 0, where(zero, 1, sum, loc).pow(1 / p, loc), loc);
}

// -- movement
Tensor Tensor::reshape(const Shape& shape_in, Loc loc) const {
    check_defined(*this, "reshape", loc);
    Shape s = shape_in;
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == -1) {
            if (infer >= 0) fail("reshape: more than one -1 in " + shape_str(shape_in), loc);
            infer = int(i);
        } else {
            known *= s[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel() % known != 0)
            fail(strf("reshape: cannot reshape %s (%lld elements) to %s",
                      shape_str(shape()).c_str(), (long long)numel(), shape_str(shape_in).c_str()),
                 loc);
        s[size_t(infer)] = numel() / known;
    }
    return wrap(graph_reshape(node(), s, loc));
}
Tensor Tensor::view(const Shape& shape, Loc loc) const { return reshape(shape, loc); }
Tensor Tensor::movedim(int source, int destination, Loc loc) const {
    check_defined(*this, "movedim", loc);
    int from = normalize_axis(source, shape().size(), "movedim", shape(), loc);
    int to = normalize_axis(destination, shape().size(), "movedim", shape(), loc);
    std::vector<int> order;
    for (int a = 0; a < ndim(); a++)
        if (a != from) order.push_back(a);
    order.insert(order.begin() + to, from);
    return permute(order, loc);
}
Tensor Tensor::permute(const std::vector<int>& order, Loc loc) const {
    check_defined(*this, "permute", loc);
    std::vector<int> o = order;
    for (int& a : o)
        if (a < 0 && a >= -ndim()) a += ndim();
    return wrap(graph_permute(node(), o, loc));
}
Tensor Tensor::transpose(int a0, int a1, Loc loc) const {
    check_defined(*this, "transpose", loc);
    int i0 = normalize_axis(a0, size_t(ndim()), "transpose", shape(), loc);
    int i1 = normalize_axis(a1, size_t(ndim()), "transpose", shape(), loc);
    if (ndim() == 0) return *this;
    std::vector<int> order(static_cast<size_t>(ndim()));
    for (int i = 0; i < ndim(); i++) order[size_t(i)] = i;
    std::swap(order[size_t(i0)], order[size_t(i1)]);
    return permute(order, loc);
}
Tensor Tensor::expand(const Shape& shape_in, Loc loc) const {
    check_defined(*this, "expand", loc);
    if (shape_in.size() < shape().size())
        fail(strf("expand: cannot expand %s to %s", shape_str(shape()).c_str(),
                  shape_str(shape_in).c_str()), loc);
    size_t lead = shape_in.size() - shape().size();
    Shape src(lead, 1), target = shape_in;
    src.insert(src.end(), shape().begin(), shape().end());
    for (size_t i = 0; i < target.size(); i++)
        if (target[i] == -1) target[i] = src[i];
    return wrap(graph_expand(graph_reshape(node(), src, loc), target, loc));
}
Tensor Tensor::pad(const std::vector<std::pair<int64_t, int64_t>>& p, Scalar value, Loc loc) const {
    check_defined(*this, "pad", loc);
    Tensor padded = wrap(graph_pad(node(), p, loc));
    // no pad (a pooling's, padding 0) is this tensor, not a select that a kernel stores again
    if (value.value == 0 || padded.node() == node()) return padded;
    Tensor inside = wrap(graph_pad(graph_const(1, DType::BOOL, shape(), loc), p, loc));
    return where(inside, padded, value, loc);
}
Tensor Tensor::shrink(const std::vector<std::pair<int64_t, int64_t>>& p, Loc loc) const {
    check_defined(*this, "shrink", loc);
    return wrap(graph_shrink(node(), p, loc));
}
// x[start:end:step] as Python and PyTorch read it: negative bounds count from the end, bounds
// beyond the axis are clamped to it, and an end before the start gives an empty axis. Then
// shrink, and for step > 1 pad to a multiple of step, fold the axis into [count, step] and
// keep column 0.
Tensor Tensor::slice(int axis, int64_t start, int64_t end, int64_t step, Loc loc) const {
    check_defined(*this, "slice", loc);
    int ax = normalize_axis(axis, shape().size(), "slice", shape(), loc, false);
    if (step < 1)
        fail(strf("slice: step must be positive, got %lld (as in PyTorch; for a reversed slice, "
                  "flip the axis first)", (long long)step), loc);
    int64_t n = shape()[size_t(ax)];
    auto bound = [n](int64_t i) { return std::clamp<int64_t>(wrap_index(i, n), 0, n); };
    int64_t b = bound(start), e = std::max(b, bound(end));
    std::vector<std::pair<int64_t, int64_t>> box;
    for (int64_t d : shape()) box.push_back({0, d});
    box[size_t(ax)] = {b, e};
    Tensor x = shrink(box, loc);
    if (step == 1 || e == b) return x;
    int64_t count = (e - b + step - 1) / step;
    std::vector<std::pair<int64_t, int64_t>> pads(size_t(ndim()), {0, 0});
    pads[size_t(ax)].second = count * step - (e - b);
    x = x.pad(pads, 0, loc);
    Shape folded = x.shape();
    folded[size_t(ax)] = count;
    folded.insert(folded.begin() + ax + 1, step);
    std::vector<std::pair<int64_t, int64_t>> keep;
    for (int64_t d : folded) keep.push_back({0, d});
    keep[size_t(ax) + 1] = {0, 1};
    Shape out = shape();
    out[size_t(ax)] = count;
    return x.reshape(folded, loc).shrink(keep, loc).reshape(out, loc);
}
Tensor Tensor::flip(const std::vector<int>& axes, Loc loc) const {
    check_defined(*this, "flip", loc);
    return wrap(graph_flip(node(), normalize_axes(axes, shape(), "flip", loc), loc));
}
Tensor Tensor::flip(int axis, Loc loc) const { return flip(std::vector<int>{axis}, loc); }
Tensor Tensor::squeeze(Loc loc) const {
    check_defined(*this, "squeeze", loc);
    Shape s;
    for (int64_t d : shape())
        if (d != 1) s.push_back(d);
    return reshape(s, loc);
}
Tensor Tensor::squeeze(int axis, Loc loc) const {
    check_defined(*this, "squeeze", loc);
    int ax = normalize_axis(axis, shape().size(), "squeeze", shape(), loc);
    if (ndim() == 0 || shape()[size_t(ax)] != 1) return *this;
    Shape s = shape();
    s.erase(s.begin() + ax);
    return reshape(s, loc);
}
Tensor Tensor::unsqueeze(int axis, Loc loc) const {
    check_defined(*this, "unsqueeze", loc);
    int ax = normalize_axis(axis, shape().size() + 1, "unsqueeze", shape(), loc);
    Shape s = shape();
    s.insert(s.begin() + ax, 1);
    return reshape(s, loc);
}
Tensor Tensor::flatten(int start_axis, int end_axis, Loc loc) const {
    check_defined(*this, "flatten", loc);
    if (ndim() == 0) return reshape({1}, loc);
    int s = normalize_axis(start_axis, shape().size(), "flatten", shape(), loc);
    int e = normalize_axis(end_axis, shape().size(), "flatten", shape(), loc);
    if (s > e) fail(strf("flatten: start axis %d after end axis %d", start_axis, end_axis), loc);
    Shape out(shape().begin(), shape().begin() + s);
    int64_t n = 1;
    for (int i = s; i <= e; i++) n *= shape()[size_t(i)];
    out.push_back(n);
    out.insert(out.end(), shape().begin() + e + 1, shape().end());
    return reshape(out, loc);
}
Tensor Tensor::unflatten(int axis, const Shape& sizes, Loc loc) const {
    check_defined(*this, "unflatten", loc);
    int ax = normalize_axis(axis, shape().size(), "unflatten", shape(), loc);
    int64_t known = 1;
    int unknown = 0;
    for (int64_t n : sizes) {
        if (n == -1) unknown++;
        else known *= n;
    }
    const int64_t length = shape()[size_t(ax)];
    bool fits = !sizes.empty() && unknown <= 1 &&
                std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n >= -1; }) &&
                (unknown ? known > 0 && length % known == 0 : known == length);
    if (!fits)
        fail(strf("unflatten: axis %d of %s, %lld long, cannot split into %s", axis,
                  shape_str(shape()).c_str(), (long long)length, shape_str(sizes).c_str()),
             loc);
    Shape out(shape().begin(), shape().begin() + ax);
    for (int64_t n : sizes) out.push_back(n == -1 ? length / known : n);
    out.insert(out.end(), shape().begin() + ax + 1, shape().end());
    return reshape(out, loc);
}
Tensor Tensor::unfold(int axis, int64_t size, int64_t step, Loc loc) const {
    check_defined(*this, "unfold", loc);
    int ax = normalize_axis(axis, std::max<size_t>(1, shape().size()), "unfold", shape(), loc);
    Tensor x = ndim() == 0 ? reshape({1}, loc) : *this;
    const int64_t length = x.shape()[size_t(ax)];
    if (size < 0 || size > length || step < 1)
        fail(strf("unfold: windows of size %lld, step %lld, along axis %d of %s (%lld long): the "
                  "size must be in [0, %lld] and the step at least 1", (long long)size,
                  (long long)step, axis, shape_str(shape()).c_str(), (long long)length,
                  (long long)length),
             loc);
    const int64_t windows = (length - size) / step + 1;
    std::vector<Tensor> elements;   // element k of every window: a strided view
    for (int64_t k = 0; k < size; k++)
        elements.push_back(x.slice(ax, k, k + (windows - 1) * step + 1, step, loc));
    if (elements.empty()) {
        Shape empty = x.shape();
        empty[size_t(ax)] = windows;
        empty.push_back(0);
        return Tensor::zeros(empty, dtype(), loc);
    }
    return stack(elements, -1, loc);
}
Tensor Tensor::contiguous(Loc loc) const {
    return un(Op::CONTIGUOUS, check_defined(*this, "contiguous", loc), loc);
}
// a select on two aranges, which fuses into whatever reads it: no mask is stored
static Tensor triangle(const Tensor& x, int64_t diagonal, bool lower, const char* op, Loc loc) {
    if (check_defined(x, op, loc).ndim() < 2)
        fail(strf("%s: x %s needs at least 2 axes", op, shape_str(x.shape()).c_str()), loc);
    UserLocScope at(loc);
    int64_t rows = x.size(-2), cols = x.size(-1);
    diagonal = std::clamp<int64_t>(diagonal, -rows - 1, cols + 1);   // i + diagonal fits int32
    Tensor i = add_c(Tensor::arange(rows, loc), double(diagonal), loc).reshape({rows, 1}, loc);
    Tensor j = Tensor::arange(cols, loc).reshape({1, cols}, loc);
    return where(lower ? j <= i : j >= i, x, const_like(x, 0, x.dtype(), loc), loc);
}
Tensor Tensor::roll(int64_t shift, int axis, Loc loc) const {
    return roll(std::vector<int64_t>{shift}, std::vector<int>{axis}, loc);
}
// the last shift elements, then the others: two slices joined
Tensor Tensor::roll(const std::vector<int64_t>& shifts, const std::vector<int>& axes,
                    Loc loc) const {
    check_defined(*this, "roll", loc);
    if (shifts.size() != axes.size())
        fail(strf("roll: %zu shifts for %zu axes", shifts.size(), axes.size()), loc);
    Tensor y = *this;
    for (size_t a = 0; a < axes.size(); a++) {
        int axis = normalize_axis(axes[a], shape().size(), "roll", shape(), loc);
        int64_t n = size(axis);
        int64_t s = n ? ((shifts[a] % n) + n) % n : 0;
        if (s)
            y = cat({y.slice(axis, n - s, n, 1, loc), y.slice(axis, 0, n - s, 1, loc)}, axis,
                    loc);
    }
    return y;
}
Tensor Tensor::tril(int64_t diagonal, Loc loc) const {
    return triangle(*this, diagonal, true, "tril", loc);
}
Tensor Tensor::triu(int64_t diagonal, Loc loc) const {
    return triangle(*this, diagonal, false, "triu", loc);
}
Tensor Tensor::clone(Loc loc) const { return contiguous(loc); }
// x as [1, d0, 1, d1, ...] (leading 1s for new axes), expanded to [r0, d0, r1, d1, ...] and
// merged to [r0·d0, r1·d1, ...]
Tensor Tensor::repeat(const std::vector<int64_t>& repeats, Loc loc) const {
    check_defined(*this, "repeat", loc);
    if (repeats.size() < size_t(ndim()))
        fail(strf("repeat: %zu repeats for %s: give at least one per axis", repeats.size(),
                  shape_str(shape()).c_str()), loc);
    Shape s(repeats.size() - size_t(ndim()), 1), folded, expanded, out;
    s.insert(s.end(), shape().begin(), shape().end());
    for (size_t i = 0; i < s.size(); i++) {
        if (repeats[i] < 0)
            fail(strf("repeat: negative repeat %lld", (long long)repeats[i]), loc);
        folded.insert(folded.end(), {1, s[i]});
        expanded.insert(expanded.end(), {repeats[i], s[i]});
        out.push_back(repeats[i] * s[i]);
    }
    return reshape(folded, loc).expand(expanded, loc).reshape(out, loc);
}
std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int axis, Loc loc) const {
    check_defined(*this, "split", loc);
    int ax = normalize_axis(axis, shape().size(), "split", shape(), loc, false);
    int64_t total = 0;
    for (int64_t n : sizes) {
        if (n < 0) fail(strf("split: negative size %lld", (long long)n), loc);
        total += n;
    }
    if (total != shape()[size_t(ax)])
        fail(strf("split: sizes sum to %lld, axis %d of %s has %lld", (long long)total, ax,
                  shape_str(shape()).c_str(), (long long)shape()[size_t(ax)]), loc);
    std::vector<Tensor> pieces;
    int64_t at = 0;
    for (int64_t n : sizes) {
        pieces.push_back(slice(ax, at, at + n, 1, loc));
        at += n;
    }
    return pieces;
}
std::vector<Tensor> Tensor::split(int64_t size, int axis, Loc loc) const {
    check_defined(*this, "split", loc);
    int ax = normalize_axis(axis, shape().size(), "split", shape(), loc, false);
    if (size < 1) fail(strf("split: size must be positive, got %lld", (long long)size), loc);
    int64_t n = shape()[size_t(ax)];
    std::vector<int64_t> sizes;
    for (int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
    if (sizes.empty()) sizes.push_back(0);   // an empty axis: one empty piece, as PyTorch
    return split(sizes, ax, loc);
}
std::vector<Tensor> Tensor::chunk(int64_t chunks, int axis, Loc loc) const {
    check_defined(*this, "chunk", loc);
    int ax = normalize_axis(axis, shape().size(), "chunk", shape(), loc, false);
    if (chunks < 1)
        fail(strf("chunk: chunks must be positive, got %lld", (long long)chunks), loc);
    int64_t n = shape()[size_t(ax)];
    return split(std::max<int64_t>(1, (n + chunks - 1) / chunks), ax, loc);
}
Tensor Tensor::t(Loc loc) const {
    check_defined(*this, "t", loc);
    if (ndim() > 2)
        fail(strf("t: %s has %d axes; t() takes at most 2 (mT() swaps the last two)",
                  shape_str(shape()).c_str(), ndim()), loc);
    return ndim() < 2 ? *this : transpose(0, 1, loc);
}
Tensor Tensor::mT(Loc loc) const {
    if (check_defined(*this, "mT", loc).ndim() < 2)
        fail(strf("mT: %s has fewer than 2 axes", shape_str(shape()).c_str()), loc);
    return transpose(-2, -1, loc);
}

// -- composed
// a [..., n, k] @ b [..., k, m] = sum over k of a[..., n, k, 1] · b[..., 1, k, m]; a 1-D operand
// gets a unit axis (front for a, back for b) that is removed from the result.
Tensor Tensor::mm(const Tensor& other, Loc loc) const {
    check_defined(*this, "mm", loc), check_defined(other, "mm", loc);
    if (ndim() != 2 || other.ndim() != 2)
        fail(strf("mm: %s @ %s: both operands must have 2 axes (matmul broadcasts)",
                  shape_str(shape()).c_str(), shape_str(other.shape()).c_str()), loc);
    return matmul(other, loc);
}
Tensor Tensor::bmm(const Tensor& other, Loc loc) const {
    check_defined(*this, "bmm", loc), check_defined(other, "bmm", loc);
    if (ndim() != 3 || other.ndim() != 3 || size(0) != other.size(0))
        fail(strf("bmm: %s @ %s: both operands must have 3 axes and the same batch size",
                  shape_str(shape()).c_str(), shape_str(other.shape()).c_str()), loc);
    return matmul(other, loc);
}
Tensor Tensor::matmul(const Tensor& other, Loc loc) const {
    check_defined(*this, "matmul", loc), check_defined(other, "matmul", loc);
    if (ndim() == 0 || other.ndim() == 0)
        fail(strf("matmul: %s @ %s: both operands need at least one axis",
                  shape_str(shape()).c_str(), shape_str(other.shape()).c_str()),
             loc);
    Tensor a = ndim() == 1 ? unsqueeze(0, loc) : *this;
    Tensor b = other.ndim() == 1 ? other.unsqueeze(1, loc) : other;
    int64_t k = a.size(-1);
    if (k != b.size(-2))
        fail(strf("matmul: %s @ %s: inner dims %lld != %lld", shape_str(shape()).c_str(),
                  shape_str(other.shape()).c_str(), (long long)k, (long long)b.size(-2)), loc);
    Shape batch_a(a.shape().begin(), a.shape().end() - 2),
        batch_b(b.shape().begin(), b.shape().end() - 2);
    for (size_t i = 0; i < std::max(batch_a.size(), batch_b.size()); i++) {
        int64_t da = i < batch_a.size() ? batch_a[batch_a.size() - 1 - i] : 1;
        int64_t db = i < batch_b.size() ? batch_b[batch_b.size() - 1 - i] : 1;
        if (da != db && da != 1 && db != 1)
            fail(strf("matmul: %s @ %s: batch dims %s and %s cannot broadcast",
                      shape_str(shape()).c_str(), shape_str(other.shape()).c_str(),
                      shape_str(batch_a).c_str(), shape_str(batch_b).c_str()),
                 loc);
    }
    Shape batch = broadcast_shape(batch_a, batch_b, "matmul", loc);
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {a.size(-2), k, b.size(-1)});
    sb.insert(sb.end(), {a.size(-2), k, b.size(-1)});
    Tensor prod =
        mul(a.unsqueeze(-1, loc).expand(sa, loc), b.unsqueeze(-3, loc).expand(sb, loc), loc);
    Tensor out = reduce(Op::REDUCE_SUM, prod, {-2}, false, false, "matmul", loc);   // keeps dtype
    if (ndim() == 1) out = out.squeeze(-2, loc);
    if (other.ndim() == 1) out = out.squeeze(-1, loc);
    return out;
}
// softmax x = e^(x - max x) / Σ e^(x - max x). The max only keeps e^ in range: the value
// does not depend on it, so neither does the gradient, and the max is detached (its own
// gradient, a comparison and a count of ties per row, would add up to zero).
Tensor Tensor::softmax(int axis, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    normalize_axis(axis, shape().size(), "softmax", shape(), loc);
    Tensor x = as_float(*this, loc);
    // nothing to take a max of: empty, as PyTorch's (a new tensor, in the graph)
    if (x.numel() == 0) return mul_c(x, 1, loc);
    Tensor e = (x - x.max(std::vector<int>{axis}, true, loc).detach()).exp(loc);
    return e / e.sum(axis, true, loc);
}
// log_softmax x = (x - max x) - ln Σ e^(x - max x), the max detached as in softmax
Tensor Tensor::log_softmax(int axis, Loc loc) const {
    UserLocScope at(loc);   // for the operators below
    normalize_axis(axis, shape().size(), "log_softmax", shape(), loc);
    Tensor x = as_float(*this, loc);
    if (x.numel() == 0) return mul_c(x, 1, loc);
    Tensor shifted = x - x.max(std::vector<int>{axis}, true, loc).detach();
    return shifted - shifted.exp(loc).sum(axis, true, loc).log(loc);
}
namespace detail {
// softmax(q kᵀ / √d) over the keys; causal: key j > query i gets -∞ through a select on two
// aranges, which fuses into the kernels of the softmax
// mask (where defined): bool, true where a key takes part, or added to the scores
static Tensor attention_weights(const Tensor& q, const Tensor& k, bool causal, Loc loc,
                                const Tensor& mask = Tensor(),
                                std::optional<double> scale = std::nullopt) {
    UserLocScope at(loc);   // for the operators below
    if (q.ndim() < 2 || k.ndim() < 2 || q.size(-1) != k.size(-1))
        fail(strf("attention: queries %s and keys %s need the shapes [..., L, d] and [..., S, d]",
                  shape_str(q.shape()).c_str(), shape_str(k.shape()).c_str()), loc);
    int64_t L = q.size(-2), S = k.size(-2);
    Tensor scores = q.matmul(k.mT(loc), loc) * scale.value_or(1 / std::sqrt(double(q.size(-1))));
    if (causal) {
        Tensor i = Tensor::arange(L, loc).reshape({L, 1}, loc);
        Tensor j = Tensor::arange(S, loc).reshape({1, S}, loc);
        scores = where(j > i, -INFINITY, scores, loc);
    }
    if (mask.defined()) {
        bool fits = mask.ndim() <= scores.ndim() &&
                    (mask.dtype() == DType::BOOL || mask.dtype() == q.dtype());
        for (int d = 1; fits && d <= mask.ndim(); d++)
            fits = mask.size(-d) == 1 || mask.size(-d) == scores.size(-d);
        if (!fits)
            fail(strf("attention: attn_mask %s %s must be bool or %s and broadcast to the "
                      "scores %s (queries %s, keys %s)", dtype_name(mask.dtype()),
                      shape_str(mask.shape()).c_str(), dtype_name(q.dtype()),
                      shape_str(scores.shape()).c_str(), shape_str(q.shape()).c_str(),
                      shape_str(k.shape()).c_str()), loc);
        scores = mask.dtype() == DType::BOOL ? where(mask, scores, -INFINITY, loc)
                                             : add(scores, mask, loc);
    }
    return scores.softmax(-1, loc);
}
}  // namespace detail

static void check_index(const Tensor& src, const Tensor& index, const char* op, Loc loc) {
    check_defined(src, op, loc), check_defined(index, op, loc);
    if (index.dtype() != DType::INT32 && index.dtype() != DType::INT64)
        fail(strf("%s: index must be int32 or int64, got %s (source %s, index %s)", op,
                  dtype_name(index.dtype()), shape_str(src.shape()).c_str(),
                  shape_str(index.shape()).c_str()), loc);
}
// out[i][j] = src[index[i][j]][j] (for axis 0); index has src's rank
Tensor Tensor::gather(int axis, const Tensor& index, Loc loc) const {
    check_index(*this, index, "gather", loc);
    int ax = normalize_axis(axis, shape().size(), "gather", shape(), loc, false);
    bool ok = index.ndim() == ndim();
    for (int d = 0; ok && d < ndim(); d++) ok = d == ax || index.size(d) <= size(d);
    if (!ok)
        fail(strf("gather: index %s does not fit source %s along axis %d",
                  shape_str(index.shape()).c_str(), shape_str(shape()).c_str(), ax), loc);
    return wrap(graph_gather(node(), index.node(), ax, loc));
}
// out = src with axis replaced by the rows index picks; index is 1-D
Tensor Tensor::index_select(int axis, const Tensor& index, Loc loc) const {
    check_index(*this, index, "index_select", loc);
    int ax = normalize_axis(axis, shape().size(), "index_select", shape(), loc, false);
    if (index.ndim() != 1)
        fail(strf("index_select: index must be 1-D, got %s", shape_str(index.shape()).c_str()),
             loc);
    Shape along(size_t(ndim()), 1), out = shape();
    along[size_t(ax)] = out[size_t(ax)] = index.numel();
    return gather(ax, index.reshape(along, loc).expand(out, loc), loc);
}
// A scatter's operands: index has this's rank and is no longer than src along any axis, nor
// than this along the others; src (where given) has this's dtype, and bool only where allowed.
// Gives the axis.
static int check_scatter(const Tensor& self, const Tensor& index, const Tensor& src,
                         const char* op, int axis, bool bool_ok, Loc loc) {
    check_index(self, index, op, loc);
    int ax = normalize_axis(axis, self.shape().size(), op, self.shape(), loc, false);
    auto shapes = [&] {
        std::string text = strf("self %s %s, index %s", dtype_name(self.dtype()),
                                shape_str(self.shape()).c_str(), shape_str(index.shape()).c_str());
        if (src.defined())
            text += strf(", src %s %s", dtype_name(src.dtype()), shape_str(src.shape()).c_str());
        return text;
    };
    if (src.defined() && (src.dtype() != self.dtype() || (!bool_ok && self.dtype() == DType::BOOL)))
        fail(strf("%s: self and src must have one dtype%s; ", op, bool_ok ? "" : ", not bool") +
                 shapes(), loc);
    bool fits = index.ndim() == self.ndim() && (!src.defined() || src.ndim() == self.ndim());
    for (int d = 0; fits && d < self.ndim(); d++)
        fits = (!src.defined() || index.size(d) <= src.size(d)) &&
               (d == ax || index.size(d) <= self.size(d));
    if (!fits)
        fail(strf("%s: index must have self's rank and be no longer than %sself but along axis "
                  "%d; ", op, src.defined() ? "src along every axis, nor than " : "", ax) +
                 shapes(), loc);
    return ax;
}
// src's elements that index picks: its leading part of index's shape
static Tensor scattered_part(const Tensor& src, const Tensor& index, Loc loc) {
    std::vector<std::pair<int64_t, int64_t>> used;
    for (int64_t n : index.shape()) used.push_back({0, n});
    return src.shrink(used, loc);
}
// The primitive scatter of the largest: into shape `into` (index's, but for the axis) from
// the lowest value, max(into[.. index[i] ..], src[i]) for each i in index order; src has index's
// shape
static Tensor scatter_max(const Shape& into, int ax, const Tensor& index, const Tensor& src,
                          Loc loc) {
    return wrap(node_make(Op::SCATTER_MAX, src.dtype(), into, {src.node(), index.node()}, loc,
                          {ax}));
}
// t (index's shape but for the axis) padded with fill to this's shape along the other axes
static Tensor padded_to(const Tensor& t, const Tensor& self, int ax, Scalar fill, Loc loc) {
    std::vector<std::pair<int64_t, int64_t>> more;
    for (int d = 0; d < self.ndim(); d++)
        more.push_back({0, d == ax ? 0 : self.size(d) - t.size(d)});
    return t.pad(more, fill, loc);
}
// each element's position along the axis, int64, in shape
static Tensor positions_along(const Shape& shape, int ax, Loc loc) {
    Shape along(shape.size(), 1);
    along[size_t(ax)] = shape[size_t(ax)];
    return Tensor::arange(shape[size_t(ax)], loc).cast(DType::INT64, loc).reshape(along, loc)
        .expand(shape, loc);
}
// how many of index's elements name each place of self (int64, self's shape)
static Tensor scatter_counts(const Tensor& self, int ax, const Tensor& index, Loc loc) {
    return const_like(self, 0, DType::INT64, loc)
        .scatter_add(ax, index, const_like(index, 1, DType::INT64, loc), loc);
}

Tensor Tensor::scatter_add(int axis, const Tensor& index, const Tensor& src, Loc loc) const {
    check_defined(src, "scatter_add", loc);
    int ax = check_scatter(*this, index, src, "scatter_add", axis, false, loc);
    NodeP added = node_make(Op::SCATTER_ADD, dtype(), shape(),
                            {scattered_part(src, index, loc).node(), index.node()}, loc, {ax});
    return add(*this, wrap(added), loc);
}
// Where each place was last written: the largest position along the axis that names it
Tensor Tensor::scatter(int axis, const Tensor& index, const Tensor& src, Loc loc) const {
    check_defined(src, "scatter", loc);
    int ax = check_scatter(*this, index, src, "scatter", axis, true, loc);
    UserLocScope at(loc);   // for the operators below
    Shape into = index.shape();
    into[size_t(ax)] = size(ax);
    Tensor last = scatter_max(into, ax, index, positions_along(index.shape(), ax, loc), loc);
    Tensor picked = scattered_part(src, index, loc).gather(ax, last.maximum(0), loc);
    return where(padded_to(last >= 0, *this, ax, false, loc), padded_to(picked, *this, ax, 0, loc),
                 *this, loc);
}
Tensor Tensor::scatter(int axis, const Tensor& index, Scalar value, Loc loc) const {
    check_defined(*this, "scatter", loc);
    int ax = check_scatter(*this, index, Tensor(), "scatter", axis, true, loc);
    UserLocScope at(loc);
    return where(scatter_counts(*this, ax, index, loc) > 0,
                 const_like(*this, value.value, dtype(), loc), *this, loc);
}
Tensor Tensor::scatter_reduce(int axis, const Tensor& index, const Tensor& src,
                              const std::string& reduce, bool include_self, Loc loc) const {
    check_defined(src, "scatter_reduce", loc);
    int ax = check_scatter(*this, index, src, "scatter_reduce", axis, false, loc);
    if (reduce != "sum" && reduce != "mean" && reduce != "amax" && reduce != "amin" &&
        reduce != "prod")
        fail("scatter_reduce: reduce \"" + reduce + "\" is not sum, mean, amax, amin or prod",
             loc);
    UserLocScope at(loc);   // for the operators below
    if (reduce == "amin")   // the largest of the order reversed
        return reversed_order(reversed_order(*this, loc).scatter_reduce(
                                  ax, index, reversed_order(src, loc), "amax", include_self, loc),
                              loc);
    Tensor counts = scatter_counts(*this, ax, index, loc), hit = counts > 0;
    Tensor used = scattered_part(src, index, loc);
    if (reduce == "sum" || reduce == "mean") {
        Tensor start = include_self ? *this : const_like(*this, 0, dtype(), loc);
        Tensor total = start.scatter_add(ax, index, used, loc);
        if (reduce == "sum") return include_self ? total : where(hit, total, *this, loc);
        Tensor count = counts + (include_self ? 1 : 0);
        Tensor mean = dtype_is_float(dtype()) ? total / count.cast(dtype(), loc)
                                              : total.floor_divide(count.cast(dtype(), loc), loc);
        return where(count > 0, mean, *this, loc);
    }
    if (reduce == "amax") {
        if (!include_self)
            return where(hit, scatter_max(shape(), ax, index, used, loc), *this, loc);
        // this joins src as one more value at each place, so that ties with it share alike
        Tensor values = cat({padded_to(used, *this, ax, lowest_value(dtype()), loc), *this}, ax,
                            loc);
        Tensor places = cat({padded_to(index.cast(DType::INT64, loc), *this, ax, 0, loc),
                             positions_along(shape(), ax, loc)}, ax, loc);
        return scatter_max(shape(), ax, places, values, loc);
    }
    // prod: [.., i, place, ..], src's element i where index names the place, else 1
    Shape spread(size_t(ndim()) + 1, 1);
    spread[size_t(ax) + 1] = size(ax);
    Tensor places = Tensor::arange(size(ax), loc).cast(DType::INT64, loc).reshape(spread, loc);
    Tensor named = index.cast(DType::INT64, loc).unsqueeze(ax + 1, loc) == places;
    Tensor product = where(named, used.unsqueeze(ax + 1, loc), 1, loc).prod(ax, false, loc)
                         .cast(dtype(), loc);
    product = padded_to(product, *this, ax, 1, loc);
    return include_self ? *this * product : where(hit, product, *this, loc);
}
// source's shape: this's but index.numel() along the axis; index 1-D. Gives the axis.
static int check_index_slices(const Tensor& self, int axis, const Tensor& index,
                              const Tensor& source, const char* op, Loc loc) {
    check_defined(source, op, loc);
    check_index(self, index, op, loc);
    int ax = normalize_axis(axis, self.shape().size(), op, self.shape(), loc, false);
    Shape expected = self.shape();
    if (ax < int(expected.size())) expected[size_t(ax)] = index.numel();
    if (index.ndim() != 1 || source.shape() != expected)
        fail(strf("%s: index must be 1-D and source this's shape but along axis %d (%s); self "
                  "%s, index %s, source %s", op, ax, shape_str(expected).c_str(),
                  shape_str(self.shape()).c_str(), shape_str(index.shape()).c_str(),
                  shape_str(source.shape()).c_str()), loc);
    return ax;
}
// index (1-D) along the axis, the same for every slice: shape's
static Tensor index_spread(const Tensor& index, int ax, const Shape& shape, Loc loc) {
    Shape along(shape.size(), 1);
    along[size_t(ax)] = index.numel();
    return index.reshape(along, loc).expand(shape, loc);
}
Tensor Tensor::index_add(int axis, const Tensor& index, const Tensor& source, Scalar alpha,
                         Loc loc) const {
    int ax = check_index_slices(*this, axis, index, source, "index_add", loc);
    if (!dtype_is_float(source.dtype()) && alpha.is_float)
        fail(strf("index_add: alpha %g must be an integer for %s source", alpha.value,
                  dtype_name(source.dtype())), loc);
    Tensor scaled = alpha.value == 1 ? source : mul_c(source, alpha.value, loc);
    return scatter_add(ax, index_spread(index, ax, source.shape(), loc), scaled, loc);
}
Tensor Tensor::index_copy(int axis, const Tensor& index, const Tensor& source, Loc loc) const {
    int ax = check_index_slices(*this, axis, index, source, "index_copy", loc);
    return scatter(ax, index_spread(index, ax, source.shape(), loc), source, loc);
}
Tensor Tensor::index_reduce(int axis, const Tensor& index, const Tensor& source,
                            const std::string& reduce, bool include_self, Loc loc) const {
    int ax = check_index_slices(*this, axis, index, source, "index_reduce", loc);
    return scatter_reduce(ax, index_spread(index, ax, source.shape(), loc), source, reduce,
                          include_self, loc);
}
Tensor Tensor::index_fill(int axis, const Tensor& index, Scalar value, Loc loc) const {
    check_defined(*this, "index_fill", loc);
    check_index(*this, index, "index_fill", loc);
    int ax = normalize_axis(axis, shape().size(), "index_fill", shape(), loc, false);
    if (index.ndim() != 1)
        fail(strf("index_fill: index must be 1-D, got %s", shape_str(index.shape()).c_str()),
             loc);
    Shape spread = shape();
    if (ax < int(spread.size())) spread[size_t(ax)] = index.numel();
    return scatter(ax, index_spread(index, ax, spread, loc), value, loc);
}
// src's rows that ix picks, [*ix.shape, *src.shape[1:]]; the program checks the range. With
// from_end, a negative index counts from the end (wrapped after the flatten, so that the
// select reads it at its own position and computes it there)
static Tensor rows_of(const Tensor& src, const Tensor& ix, Loc loc, bool from_end = false) {
    Shape out = ix.shape();
    out.insert(out.end(), src.shape().begin() + 1, src.shape().end());
    Tensor rows = ix.flatten(0, -1, loc);
    if (from_end) rows = where(rows < 0, rows + src.size(0), rows, loc);
    return src.index_select(0, rows, loc).reshape(out, loc);
}
Tensor Tensor::operator[](Operand index) const {
    const Tensor& ix = index.tensor;
    Loc loc = index.loc;
    check_index(*this, ix, "index", loc);
    if (ndim() == 0) fail("index: cannot index a 0-d tensor", loc);
    UserLocScope at(loc);   // for the operators below
    return rows_of(*this, ix, loc, true);
}
Tensor Tensor::operator[](Index index) const {
    if (check_defined(*this, "index", index.loc).ndim() == 0)
        fail("index: cannot index a 0-d tensor", index.loc);
    int64_t n = shape()[0], j = wrap_index(index.i, n);
    if (j < 0 || j >= n)
        fail(strf("index: %lld out of range for shape %s", (long long)index.i,
                  shape_str(shape()).c_str()), index.loc);
    return slice(0, j, j + 1, 1, index.loc).squeeze(0, index.loc);
}

// cat: each piece is padded to the full length along the axis and the pieces are added
Tensor cat(const std::vector<Tensor>& ts, int axis, Loc loc) {
    if (ts.empty()) fail("cat: no tensors", loc);
    for (const Tensor& t : ts) check_defined(t, "cat", loc);
    int ax = normalize_axis(axis, ts[0].shape().size(), "cat", ts[0].shape(), loc, false);
    DType dt = ts[0].dtype();
    int64_t total = 0;
    for (const Tensor& t : ts) {
        bool ok = t.ndim() == ts[0].ndim();
        for (int d = 0; ok && d < t.ndim(); d++) ok = d == ax || t.size(d) == ts[0].size(d);
        if (!ok)
            fail(strf("cat: shapes %s and %s differ outside axis %d",
                      shape_str(ts[0].shape()).c_str(), shape_str(t.shape()).c_str(), ax),
                 loc);
        total += t.size(ax);
        dt = promote(dt, t.dtype());
    }
    Tensor out;
    int64_t offset = 0;
    for (const Tensor& t : ts) {
        std::vector<std::pair<int64_t, int64_t>> p(size_t(t.ndim()), {0, 0});
        p[size_t(ax)] = {offset, total - offset - t.size(ax)};
        offset += t.size(ax);
        Tensor piece = t.cast(dt, loc).pad(p, 0, loc);
        out = out.defined() ? add(out, piece, loc) : piece;
    }
    return out;
}
Tensor stack(const std::vector<Tensor>& ts, int axis, Loc loc) {
    if (ts.empty()) fail("stack: no tensors", loc);
    for (const Tensor& t : ts) check_defined(t, "stack", loc);
    for (const Tensor& t : ts)
        if (t.shape() != ts[0].shape())
            fail(strf("stack: shapes %s and %s differ", shape_str(ts[0].shape()).c_str(),
                      shape_str(t.shape()).c_str()), loc);
    int ax = normalize_axis(axis, ts[0].shape().size() + 1, "stack", ts[0].shape(), loc);
    std::vector<Tensor> parts;
    for (const Tensor& t : ts) parts.push_back(t.unsqueeze(ax, loc));
    return cat(parts, ax, loc);
}

// einsum: every operand is lined up on one list of index letters (the output's, in its order,
// with the summed ones among them), the operands are multiplied with broadcasting, and the
// letters that are not in the output are summed away. A letter repeated in one operand takes a
// diagonal first.
namespace detail {
static const int ELLIPSIS_LABEL = 100;   // ellipsis axes get labels 100, 101, ...

// x [..., n, n] → its diagonal [..., n]: row i keeps column i, a gather along the last axis.
// (A pad-and-fold view would nest a condition into the index at every repeated letter, so
// "iiii..." would grow exponentially.)
static Tensor diagonal_last2(const Tensor& x, Loc loc) {
    int64_t n = x.size(-1);
    Shape rows(size_t(x.ndim()), 1), picks = x.shape();
    rows[rows.size() - 2] = n;
    picks.back() = 1;
    Tensor column = Tensor::arange(n, loc).reshape(rows, loc).expand(picks, loc);
    return x.gather(-1, column, loc).squeeze(-1, loc);
}
}  // namespace detail

Tensor cdist(const Tensor& x1, const Tensor& x2, double p, Loc loc) {
    check_defined(x1, "cdist", loc), check_defined(x2, "cdist", loc);
    if (x1.ndim() < 2 || x2.ndim() < 2 || x1.size(-1) != x2.size(-1))
        fail(strf("cdist: x1 %s and x2 %s must be [..., P, M] and [..., R, M]",
                  shape_str(x1.shape()).c_str(), shape_str(x2.shape()).c_str()),
             loc);
    if (!(p >= 0)) fail(strf("cdist: p must be at least 0, got %g", p), loc);
    UserLocScope at(loc);
    Tensor differences = x1.unsqueeze(-2) - x2.unsqueeze(-3);   // [..., P, R, M]
    if (p == 0) return (differences != 0).cast(as_float(x1, loc).dtype()).sum(-1);
    if (p != INFINITY) return differences.norm(p, -1);
    // the largest |difference|, its gradient whole to each that ties for it (torch.cdist's;
    // norm's shares it among them): the value, plus terms that are 0 and carry the gradient
    Tensor size = differences.abs(), largest = size.detach().max(-1, true).values;
    Tensor ties = where(size.detach() == largest, size - size.detach(), 0).sum(-1);
    return largest.squeeze(-1) + ties;
}
// The two axes moved last and joined; the diagonal is then every (cols + 1)-th element,
// starting at the offset's first one
Tensor diagonal(const Tensor& x, int64_t offset, int axis1, int axis2, Loc loc) {
    check_defined(x, "diagonal", loc);
    if (x.ndim() < 2)
        fail(strf("diagonal: x %s needs 2 axes", shape_str(x.shape()).c_str()), loc);
    int a1 = normalize_axis(axis1, x.shape().size(), "diagonal", x.shape(), loc);
    int a2 = normalize_axis(axis2, x.shape().size(), "diagonal", x.shape(), loc);
    if (a1 == a2) fail(strf("diagonal: axis1 and axis2 are both %d", a1), loc);
    UserLocScope at(loc);
    std::vector<int> order;
    for (int a = 0; a < x.ndim(); a++)
        if (a != a1 && a != a2) order.push_back(a);
    order.push_back(a1);
    order.push_back(a2);
    Tensor moved = x.permute(order);
    const int64_t rows = x.size(a1), cols = x.size(a2);
    const int64_t length = std::max<int64_t>(0, offset >= 0 ? std::min(rows, cols - offset)
                                                            : std::min(rows + offset, cols));
    Tensor flat = moved.flatten(-2, -1);
    if (length == 0) return flat.slice(-1, 0, 0);
    const int64_t start = offset >= 0 ? offset : -offset * cols;
    return flat.slice(-1, start, start + (length - 1) * (cols + 1) + 1, cols + 1);
}
Tensor trace(const Tensor& x, Loc loc) {
    check_defined(x, "trace", loc);
    if (x.ndim() != 2) fail(strf("trace: x %s is not a matrix", shape_str(x.shape()).c_str()), loc);
    return diagonal(x, 0, 0, 1, loc).sum(loc);
}
Tensor diag(const Tensor& x, int64_t offset, Loc loc) {
    check_defined(x, "diag", loc);
    if (x.ndim() == 2) return diagonal(x, offset, 0, 1, loc);
    if (x.ndim() != 1)
        fail(strf("diag: x %s must be a vector or a matrix", shape_str(x.shape()).c_str()), loc);
    UserLocScope at(loc);
    const int64_t n = x.size(0), size = n + std::abs(offset);
    Tensor i = Tensor::arange(size).reshape({size, 1}), j = Tensor::arange(size).reshape({1, size});
    // entry (i, j) holds x[k] where j - i = offset, k = min(i, j)
    Tensor k = (offset >= 0 ? i : j).expand({size, size});
    Tensor picked = x.index_select(0, k.clamp(0, n - 1).reshape({-1})).reshape({size, size});
    return where(j - i == offset, picked, 0);
}
Tensor outer(const Tensor& a, const Tensor& b, Loc loc) {
    check_defined(a, "outer", loc), check_defined(b, "outer", loc);
    if (a.ndim() != 1 || b.ndim() != 1)
        fail(strf("outer: a %s and b %s must be vectors", shape_str(a.shape()).c_str(),
                  shape_str(b.shape()).c_str()), loc);
    UserLocScope at(loc);
    return a.unsqueeze(1) * b.unsqueeze(0);
}
// a [a0, a1, ...] and b [b0, b1, ...] as [a0, 1, a1, 1, ...] · [1, b0, 1, b1, ...], then each
// pair of axes joined
Tensor kron(const Tensor& a_in, const Tensor& b_in, Loc loc) {
    check_defined(a_in, "kron", loc), check_defined(b_in, "kron", loc);
    UserLocScope at(loc);
    const int rank = std::max(a_in.ndim(), b_in.ndim());
    auto padded = [&](const Tensor& t) {
        Shape s(size_t(rank - t.ndim()), 1);
        s.insert(s.end(), t.shape().begin(), t.shape().end());
        return t.reshape(s);
    };
    Tensor a = padded(a_in), b = padded(b_in);
    Shape spread_a, spread_b, joined;
    for (int d = 0; d < rank; d++) {
        spread_a.insert(spread_a.end(), {a.size(d), 1});
        spread_b.insert(spread_b.end(), {1, b.size(d)});
        joined.push_back(a.size(d) * b.size(d));
    }
    return (a.reshape(spread_a) * b.reshape(spread_b)).reshape(joined);
}
Tensor diff(const Tensor& x, int64_t n, int axis, Loc loc) {
    check_defined(x, "diff", loc);
    if (x.ndim() == 0) fail("diff: x is a scalar; it needs an axis", loc);
    int ax = normalize_axis(axis, x.shape().size(), "diff", x.shape(), loc);
    if (n < 0) fail(strf("diff: n must be at least 0, got %lld", (long long)n), loc);
    UserLocScope at(loc);
    Tensor y = x;
    for (int64_t i = 0; i < n && y.size(ax) > 0; i++) {
        const int64_t length = y.size(ax);
        Tensor later = y.slice(ax, 1, length), earlier = y.slice(ax, 0, length - 1);
        y = y.dtype() == DType::BOOL ? logical_xor(later, earlier) : later - earlier;
    }
    return y;
}
Tensor logaddexp(const Tensor& a, const Tensor& b, Loc loc) {
    check_defined(a, "logaddexp", loc), check_defined(b, "logaddexp", loc);
    UserLocScope at(loc);
    Tensor larger = a.maximum(b), gap = (a - b).abs();
    // equal infinities: their gap is NaN; the sum is the infinity itself
    return where(logical_and(a == b, a.isinf()), a, larger + (-gap).exp().log1p());
}
// counts by comparison: [..., m, n] booleans summed over n
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right, Loc loc) {
    check_defined(sorted, "searchsorted", loc), check_defined(values, "searchsorted", loc);
    Shape lead_sorted(sorted.shape().begin(), sorted.shape().end() - (sorted.ndim() ? 1 : 0));
    Shape lead_values(values.shape().begin(), values.shape().end() - (values.ndim() ? 1 : 0));
    if (sorted.ndim() == 0 || (sorted.ndim() > 1 && lead_sorted != lead_values))
        fail(strf("searchsorted: sorted %s and values %s: sorted [..., n] needs values [..., m] "
                  "of the same leading axes (or sorted 1-D)", shape_str(sorted.shape()).c_str(),
                  shape_str(values.shape()).c_str()), loc);
    UserLocScope at(loc);
    Tensor edges = sorted.unsqueeze(-2), v = values.unsqueeze(-1);
    if (sorted.ndim() == 1) edges = sorted;   // against every value
    return (right ? edges <= v : edges < v).cast(DType::INT64).sum(-1);
}
Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool right, Loc loc) {
    check_defined(input, "bucketize", loc), check_defined(boundaries, "bucketize", loc);
    if (boundaries.ndim() != 1)
        fail(strf("bucketize: boundaries %s must be 1-D", shape_str(boundaries.shape()).c_str()),
             loc);
    UserLocScope at(loc);
    Tensor v = input.unsqueeze(-1);
    return (right ? boundaries <= v : boundaries < v).cast(DType::INT64).sum(-1);
}
Tensor quantile(const Tensor& x, double q, std::optional<int> axis, bool keepdim,
                const std::string& interpolation, Loc loc) {
    return quantile(x, std::vector<double>{q}, axis, keepdim, interpolation, loc).squeeze(0, loc);
}
Tensor quantile(const Tensor& x, const std::vector<double>& qs, std::optional<int> axis,
                bool keepdim, const std::string& interpolation, Loc loc) {
    check_defined(x, "quantile", loc);
    if (!dtype_is_float(x.dtype()))
        fail(strf("quantile: x must be float, got %s", dtype_name(x.dtype())), loc);
    const char* ways[] = {"linear", "lower", "higher", "midpoint", "nearest"};
    if (std::find(std::begin(ways), std::end(ways), interpolation) == std::end(ways))
        fail("quantile: interpolation '" + interpolation +
             "' is not linear, lower, higher, midpoint or nearest", loc);
    for (double q : qs)
        if (!(q >= 0 && q <= 1)) fail(strf("quantile: q = %g is not in [0, 1]", q), loc);
    UserLocScope at(loc);
    int ax = axis ? normalize_axis(*axis, x.shape().size(), "quantile", x.shape(), loc) : 0;
    Tensor rows = axis ? x : x.flatten(0, -1, loc);
    if (rows.ndim() == 0) rows = rows.reshape({1}, loc);
    check_not_empty(rows.shape(), {ax}, "quantile", loc);
    Tensor sorted = rows.sort(ax, false, loc).values;
    const int64_t n = rows.size(ax);
    Tensor last = sorted.slice(ax, n - 1, n, 1, loc), has_nan = last.isnan(loc);   // NaN last
    std::vector<Tensor> picked;
    for (double q : qs) {
        const double rank = q * double(n - 1), below = std::floor(rank);
        const double weight = rank - below, above = std::ceil(rank);
        auto at_rank = [&](double r) { return sorted.slice(ax, int64_t(r), int64_t(r) + 1, 1); };
        Tensor v = interpolation == "lower"    ? at_rank(below)
                   : interpolation == "higher" ? at_rank(above)
                   : interpolation == "nearest" ? at_rank(std::nearbyint(rank))
                   : at_rank(below).lerp(at_rank(above),
                                         interpolation == "midpoint" ? 0.5 : weight);
        picked.push_back(where(has_nan, last, v));   // a NaN, with the gradient, as PyTorch's
    }
    Tensor out = stack(picked, 0);   // [q, ...rows with the axis 1]
    if (!keepdim) return out.squeeze(ax + 1);
    if (axis) return out;
    Shape ones(size_t(x.ndim()) + 1, 1);   // every axis of x kept, as 1
    ones[0] = int64_t(qs.size());
    return out.reshape(ones);
}
Tensor tensordot(const Tensor& a, const Tensor& b, int dims, Loc loc) {
    check_defined(a, "tensordot", loc), check_defined(b, "tensordot", loc);
    if (dims < 0 || dims > a.ndim() || dims > b.ndim())
        fail(strf("tensordot: dims = %d for a %s and b %s", dims, shape_str(a.shape()).c_str(),
                  shape_str(b.shape()).c_str()), loc);
    std::vector<int> axes_a, axes_b;
    for (int i = 0; i < dims; i++) axes_a.push_back(a.ndim() - dims + i), axes_b.push_back(i);
    return tensordot(a, b, axes_a, axes_b, loc);
}
// a as [free, summed] and b as [summed, free]: one product
Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int>& axes_a,
                 const std::vector<int>& axes_b, Loc loc) {
    check_defined(a, "tensordot", loc), check_defined(b, "tensordot", loc);
    auto bad = [&](const std::string& why) {
        fail(strf("tensordot: a %s and b %s: ", shape_str(a.shape()).c_str(),
                  shape_str(b.shape()).c_str()) + why, loc);
    };
    if (axes_a.size() != axes_b.size())
        bad(strf("%zu axes of a against %zu of b", axes_a.size(), axes_b.size()));
    std::vector<int> sum_a = normalize_axes(axes_a, a.shape(), "tensordot", loc);
    std::vector<int> sum_b = normalize_axes(axes_b, b.shape(), "tensordot", loc);
    for (size_t i = 0; i < sum_a.size(); i++)
        if (a.size(sum_a[i]) != b.size(sum_b[i]))
            bad(strf("a's axis %d (%lld) against b's axis %d (%lld)", sum_a[i],
                     (long long)a.size(sum_a[i]), sum_b[i], (long long)b.size(sum_b[i])));
    UserLocScope at(loc);
    auto free_axes = [](const Tensor& t, const std::vector<int>& summed) {
        std::vector<int> kept;
        for (int d = 0; d < t.ndim(); d++)
            if (std::find(summed.begin(), summed.end(), d) == summed.end()) kept.push_back(d);
        return kept;
    };
    std::vector<int> free_a = free_axes(a, sum_a), free_b = free_axes(b, sum_b);
    Shape out;
    int64_t rows = 1, columns = 1, inner = 1;
    for (int d : free_a) out.push_back(a.size(d)), rows *= a.size(d);
    for (int d : free_b) out.push_back(b.size(d)), columns *= b.size(d);
    for (int d : sum_a) inner *= a.size(d);
    std::vector<int> order_a = free_a, order_b = sum_b;
    order_a.insert(order_a.end(), sum_a.begin(), sum_a.end());
    order_b.insert(order_b.end(), free_b.begin(), free_b.end());
    Tensor left = a.permute(order_a).reshape({rows, inner});
    Tensor right = b.permute(order_b).reshape({inner, columns});
    return left.mm(right).reshape(out);
}
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, const std::string& indexing,
                             Loc loc) {
    if (indexing != "ij" && indexing != "xy")
        fail("meshgrid: indexing '" + indexing + "' is not ij or xy", loc);
    Shape grid;
    for (const Tensor& t : tensors) {
        if (check_defined(t, "meshgrid", loc).ndim() > 1)
            fail(strf("meshgrid: each tensor must be 1-D or 0-d, got %s",
                      shape_str(t.shape()).c_str()), loc);
        grid.push_back(t.numel());
    }
    // "xy": the first tensor runs along the second axis, the second along the first
    const bool swapped = indexing == "xy" && grid.size() > 1;
    auto axis_of = [&](size_t i) { return swapped && i < 2 ? 1 - i : i; };
    if (swapped) std::swap(grid[0], grid[1]);
    std::vector<Tensor> grids;
    for (size_t i = 0; i < tensors.size(); i++) {
        Shape along(grid.size(), 1);
        along[axis_of(i)] = grid[axis_of(i)];
        grids.push_back(tensors[i].reshape(along, loc).expand(grid, loc));
    }
    return grids;
}
// c = a' b'' - a'' b', where ' and '' roll the axis on by one and by two
Tensor cross(const Tensor& a, const Tensor& b, int axis, Loc loc) {
    auto [x, y] = operands(a, b, "cross", loc);
    int ax = normalize_axis(axis, x.shape().size(), "cross", x.shape(), loc);
    if (x.ndim() == 0 || x.size(ax) != 3)
        fail(strf("cross: a %s and b %s need 3 elements along axis %d",
                  shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str(), axis), loc);
    UserLocScope at(loc);
    return x.roll(-1, ax) * y.roll(-2, ax) - x.roll(-2, ax) * y.roll(-1, ax);
}
Tensor hypot(const Tensor& a, const Tensor& b, Loc loc) {
    auto [x, y] = operands(a, b, "hypot", loc, true);
    UserLocScope at(loc);
    Tensor ax = x.abs(), ay = y.abs(), larger = ax.maximum(ay), smaller = ax.minimum(ay);
    Tensor ratio = smaller / where(larger == 0, 1, larger);   // ∞/∞ and NaN: taken below
    Tensor h = where(larger == 0, 0, larger * (ratio * ratio + 1).sqrt());
    return where(ax.isinf().maximum(ay.isinf()), INFINITY, h);   // even beside a NaN, as C's
}
Tensor copysign(const Tensor& a, const Tensor& b, Loc loc) {
    auto [x, y] = operands(a, b, "copysign", loc, true);
    UserLocScope at(loc);
    Tensor magnitude = x.abs();
    return where(sign_bit(y, loc), -magnitude, magnitude);
}
Tensor sinc(const Tensor& x_in, Loc loc) {
    UserLocScope at(loc);
    Tensor x = as_float(check_defined(x_in, "sinc", loc), loc), zero = x == 0;
    Tensor turned = where(zero, 1, x) * PI;
    return where(zero, 1, turned.sin() / turned);
}
// scatter_add of ones (or the weights) into zeros, at each value
Tensor bincount(const Tensor& x, const Tensor& weights, int64_t minlength, Loc loc) {
    check_defined(x, "bincount", loc);
    if (x.ndim() != 1 || dtype_is_float(x.dtype()) || x.dtype() == DType::BOOL)
        fail(strf("bincount: x must be 1-D and integer, got %s %s", dtype_name(x.dtype()),
                  shape_str(x.shape()).c_str()), loc);
    if (weights.defined() && weights.shape() != x.shape())
        fail(strf("bincount: weights %s must have x's shape %s", shape_str(weights.shape()).c_str(),
                  shape_str(x.shape()).c_str()), loc);
    if (minlength < 0) fail(strf("bincount: minlength %lld < 0", (long long)minlength), loc);
    int64_t length = minlength;
    for (int64_t v : x.to_vector<int64_t>(loc)) {
        if (v < 0)
            fail(strf("bincount: x holds %lld; its values must be 0 or more", (long long)v), loc);
        length = std::max(length, v + 1);
    }
    UserLocScope at(loc);
    Tensor counted = !weights.defined() ? const_like(x, 1, DType::INT64, loc)
                     : weights.dtype() == DType::FLOAT32 ? weights
                                                         : weights.cast(DType::FLOAT64);
    Tensor zeros = on_device_of(x, Tensor::zeros({length}, counted.dtype(), loc), loc);
    return zeros.scatter_add(0, x, counted);
}
Tensor histc(const Tensor& x_in, int64_t bins, double min, double max, Loc loc) {
    check_defined(x_in, "histc", loc);
    if (bins < 1) fail(strf("histc: bins = %lld must be at least 1", (long long)bins), loc);
    if (min > max) fail(strf("histc: min %g is above max %g", min, max), loc);
    UserLocScope at(loc);
    Tensor x = as_float(x_in, loc).detach().flatten();
    Tensor counts = on_device_of(x, Tensor::zeros({bins}, x.dtype(), loc), loc);
    if (x.numel() == 0) return counts;
    Tensor low = const_like(x, min, x.dtype(), loc), high = const_like(x, max, x.dtype(), loc);
    if (min == max) {
        Tensor nan = x != x;   // left out of the range too
        low = where(nan, INFINITY, x).min().expand(x.shape());
        high = where(nan, -INFINITY, x).max().expand(x.shape());
        Tensor same = low == high;
        low = where(same, low - 1, low), high = where(same, high + 1, high);
    }
    Tensor inside = (x >= low).minimum(x <= high);   // NaN: neither
    Tensor bin = ((x - low) * double(bins) / (high - low)).floor().clamp(0, bins - 1);
    return counts.scatter_add(0, where(inside, bin, 0).cast(DType::INT64), inside.cast(x.dtype()));
}
// upper: j - i >= offset, else j - i <= offset
static Tensor triangle_indices(int64_t rows, int64_t cols, int64_t offset, bool upper,
                               const char* op, Loc loc) {
    if (rows < 0 || cols < 0)
        fail(strf("%s: rows %lld and cols %lld must not be negative", op, (long long)rows,
                  (long long)cols), loc);
    std::vector<int64_t> is, js;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            if (upper ? j - i >= offset : j - i <= offset) is.push_back(i), js.push_back(j);
    const int64_t n = int64_t(is.size());
    is.insert(is.end(), js.begin(), js.end());
    return Tensor::from_vector(is, {2, n}, loc);
}
Tensor tril_indices(int64_t rows, int64_t cols, int64_t offset, Loc loc) {
    return triangle_indices(rows, cols, offset, false, "tril_indices", loc);
}
Tensor triu_indices(int64_t rows, int64_t cols, int64_t offset, Loc loc) {
    return triangle_indices(rows, cols, offset, true, "triu_indices", loc);
}
// one turn: the second axis flipped, then the two swapped; three: the first flipped
Tensor rot90(const Tensor& x, int64_t k, int axis0, int axis1, Loc loc) {
    check_defined(x, "rot90", loc);
    if (x.ndim() < 2) fail(strf("rot90: x %s needs 2 axes", shape_str(x.shape()).c_str()), loc);
    int a0 = normalize_axis(axis0, x.shape().size(), "rot90", x.shape(), loc);
    int a1 = normalize_axis(axis1, x.shape().size(), "rot90", x.shape(), loc);
    if (a0 == a1) fail(strf("rot90: both axes are %d", a0), loc);
    switch (((k % 4) + 4) % 4) {
    case 1: return x.flip(a1, loc).transpose(a0, a1, loc);
    case 2: return x.flip({a0, a1}, loc);
    case 3: return x.flip(a0, loc).transpose(a0, a1, loc);
    default: return x;
    }
}
// each block padded to the full width at its columns, the stripes joined by cat
Tensor block_diag(const std::vector<Tensor>& tensors, Loc loc) {
    std::vector<Tensor> blocks;
    int64_t width = 0;
    DType dt = DType::BOOL;
    for (const Tensor& t : tensors) {
        if (check_defined(t, "block_diag", loc).ndim() > 2)
            fail(strf("block_diag: each tensor must have at most 2 axes, got %s",
                      shape_str(t.shape()).c_str()), loc);
        blocks.push_back(t.ndim() == 2 ? t : t.reshape({1, t.numel()}, loc));
        width += blocks.back().size(1);
        dt = promote(dt, t.dtype());
    }
    if (blocks.empty()) return Tensor::zeros({1, 0}, DType::FLOAT32, loc);
    UserLocScope at(loc);
    std::vector<Tensor> stripes;
    int64_t left = 0;
    for (const Tensor& block : blocks) {
        int64_t columns = block.size(1);
        stripes.push_back(block.cast(dt).pad({{0, 0}, {left, width - left - columns}}));
        left += columns;
    }
    return cat(stripes, 0);
}
Tensor cartesian_prod(const std::vector<Tensor>& tensors, Loc loc) {
    std::vector<Tensor> grids = meshgrid(tensors, "ij", loc);
    if (grids.size() == 1) return grids[0];
    UserLocScope at(loc);
    for (Tensor& g : grids) g = g.flatten();
    return stack(grids, 1);
}
Tensor einsum(const std::string& spec_in, const std::vector<Tensor>& operands, Loc loc) {
    for (const Tensor& t : operands) check_defined(t, "einsum", loc);
    std::string spec;
    for (char c : spec_in)
        if (!std::isspace((unsigned char)c)) spec += c;
    std::string shapes;
    for (const Tensor& t : operands) shapes += (shapes.empty() ? "" : ", ") + shape_str(t.shape());
    auto bad = [&](const std::string& why) {
        fail("einsum: bad spec '" + spec_in + "' for shapes " + shapes + ": " + why, loc);
    };
    // a term as labels: 'A'-'Z' → 0-25, 'a'-'z' → 26-51 (so sorting is alphabetical), "..." → -1
    auto parse = [&](const std::string& term) {
        std::vector<int> labels;
        for (size_t i = 0; i < term.size(); i++) {
            char c = term[i];
            if (c >= 'A' && c <= 'Z') labels.push_back(c - 'A');
            else if (c >= 'a' && c <= 'z') labels.push_back(26 + c - 'a');
            else if (term.compare(i, 3, "...") == 0) {
                if (std::count(labels.begin(), labels.end(), -1))
                    bad("more than one '...' in a term");
                labels.push_back(-1);
                i += 2;
            } else bad(strf("unexpected character '%c'", c));
        }
        return labels;
    };
    auto letter = [](int l) { return char(l < 26 ? 'A' + l : 'a' + l - 26); };
    size_t arrow = spec.find("->");
    std::string lhs = spec.substr(0, arrow);
    std::vector<std::vector<int>> terms;
    for (size_t start = 0;;) {
        size_t comma = lhs.find(',', start);
        terms.push_back(parse(lhs.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    if (terms.size() != operands.size())
        bad(strf("%zu terms for %zu operands", terms.size(), operands.size()));
    // ellipsis axes: right-aligned across operands and broadcast, labelled 100, 101, ...
    size_t ell_rank = 0;
    for (size_t i = 0; i < terms.size(); i++) {
        size_t named = terms[i].size() - size_t(std::count(terms[i].begin(), terms[i].end(), -1));
        bool has_ell = named != terms[i].size();
        size_t nd = size_t(operands[i].ndim());
        if (has_ell ? nd < named : nd != named)
            bad(strf("operand %zu has %zu axes, its term names %zu", i, nd, named));
        if (has_ell) ell_rank = std::max(ell_rank, nd - named);
    }
    std::map<int, int> count;   // for the implicit output: letters written exactly once
    for (auto& t : terms)
        for (int l : t)
            if (l >= 0) count[l]++;
    std::vector<Tensor> xs = operands;
    std::map<int, int64_t> size_of;
    std::vector<int> first_seen;
    for (size_t i = 0; i < terms.size(); i++) {
        std::vector<int> labels;
        size_t named = terms[i].size() - size_t(std::count(terms[i].begin(), terms[i].end(), -1));
        size_t mine = size_t(xs[i].ndim()) - named;
        for (int l : terms[i]) {
            if (l != -1) { labels.push_back(l); continue; }
            for (size_t j = 0; j < mine; j++)
                labels.push_back(ELLIPSIS_LABEL + int(ell_rank - mine + j));
        }
        // a repeated letter: move the pair to the end and take the diagonal
        for (size_t a = 0; a < labels.size(); a++) {
            for (size_t b = a + 1; b < labels.size(); b++) {
                if (labels[a] != labels[b]) continue;
                if (xs[i].size(int(a)) != xs[i].size(int(b)))
                    bad(strf("letter '%c' has sizes %lld and %lld in operand %zu",
                             letter(labels[a]), (long long)xs[i].size(int(a)),
                             (long long)xs[i].size(int(b)), i));
                std::vector<int> order;
                std::vector<int> rest;
                for (size_t d = 0; d < labels.size(); d++)
                    if (d != a && d != b) { order.push_back(int(d)); rest.push_back(labels[d]); }
                order.push_back(int(a));
                order.push_back(int(b));
                rest.push_back(labels[a]);
                xs[i] = diagonal_last2(xs[i].permute(order, loc), loc);
                labels = rest;
                a = size_t(-1);
                break;
            }
        }
        for (size_t d = 0; d < labels.size(); d++) {
            int64_t s = xs[i].size(int(d));
            auto it = size_of.find(labels[d]);
            if (it == size_of.end()) { size_of[labels[d]] = s; first_seen.push_back(labels[d]); }
            else if (it->second == 1) it->second = s;
            else if (s != 1 && s != it->second) {
                if (labels[d] >= ELLIPSIS_LABEL) bad("'...' axes cannot broadcast");
                bad(strf("letter '%c' has sizes %lld and %lld", letter(labels[d]),
                         (long long)it->second, (long long)s));
            }
        }
        terms[i] = labels;
    }
    std::vector<int> out;
    if (arrow != std::string::npos) {
        for (int l : parse(spec.substr(arrow + 2))) {
            if (l == -1) {
                for (size_t j = 0; j < ell_rank; j++) out.push_back(ELLIPSIS_LABEL + int(j));
                continue;
            }
            if (!size_of.count(l)) bad(strf("output letter '%c' is not in any input", letter(l)));
            if (std::count(out.begin(), out.end(), l))
                bad(strf("output letter '%c' repeated", letter(l)));
            out.push_back(l);
        }
    } else {
        for (size_t j = 0; j < ell_rank; j++) out.push_back(ELLIPSIS_LABEL + int(j));
        for (auto& [l, c] : count)
            if (c == 1) out.push_back(l);
    }
    // The product's axes: the output's, each summed letter before the first output letter
    // after it in the first operand that has it, so that this operand's axes keep their order
    // (a convolution's input [n, c, x, y] into [n, o, x, y]: its windows read, and their
    // gradient is stored, along the rows of x and y, not across channels).
    auto is_out = [&](int l) { return std::count(out.begin(), out.end(), l) > 0; };
    std::vector<int> all = out;
    for (int l : first_seen) {
        if (is_out(l)) continue;
        auto at = all.end();
        for (const std::vector<int>& t : terms) {
            auto it = std::find(t.begin(), t.end(), l);
            if (it == t.end()) continue;
            auto next = std::find_if(it, t.end(), is_out);
            if (next != t.end()) at = std::find(all.begin(), all.end(), *next);
            break;
        }
        all.insert(at, l);
    }
    Shape full;
    for (int l : all) full.push_back(size_of[l]);
    Tensor prod;
    for (size_t i = 0; i < xs.size(); i++) {
        std::vector<int> order;
        Shape aligned;
        for (int l : all) {
            auto it = std::find(terms[i].begin(), terms[i].end(), l);
            if (it != terms[i].end()) order.push_back(int(it - terms[i].begin()));
            aligned.push_back(it != terms[i].end() ? xs[i].size(int(it - terms[i].begin())) : 1);
        }
        Tensor x = xs[i].permute(order, loc).reshape(aligned, loc).expand(full, loc);
        prod = prod.defined() ? mul(prod, x, loc) : x;
    }
    std::vector<int> summed;
    for (size_t d = 0; d < all.size(); d++)
        if (!is_out(all[d])) summed.push_back(int(d));
    if (summed.empty()) return prod;
    return reduce(Op::REDUCE_SUM, prod, summed, false, false, "einsum", loc);   // keeps dtype
}

// ---- [AUTOGRAD] reverse mode over the lazy graph ------------------------------------- >>autograd
// One backward rule per primitive, in the op table's order, each beside its identity. A rule
// turns the gradient g of a node's output into gradients of its inputs, using Tensor ops: the
// gradients are lazy graph like everything else, so they fuse with the forward pass and the
// update, and (tg::gradients) can be differentiated again. Tests: tests/test_autograd.cpp
// (central differences in float64 for every op, a Hessian-vector product).

namespace detail {

static bool is_zero(const NodeP& n) { return n->op == Op::CONST && n->value == 0; }
static bool is_relu(const Node* n) {   // where(x <= 0, 0, x), as Tensor::relu builds it
    if (n->op != Op::WHERE || !is_zero(n->src[1])) return false;
    const Node* c = n->src[0].get();
    const NodeP& x = n->src[2];
    auto test = [&](const NodeP& t, Op op) {
        return t->op == op && t->src[0] == x && is_zero(t->src[1]);
    };
    return c->op == Op::MAX && test(c->src[0], Op::CMPLT) && test(c->src[1], Op::CMPEQ);
}

static std::vector<Tensor> backward_rule(const NodeP& n, const Tensor& g) {
    auto src = [&](size_t i) { return wrap(n->src[i]); };
    Tensor out = wrap(n);
    Loc loc = n->loc;
    DType dt = n->dtype;
    const Shape& in = n->src.empty() ? n->shape : n->src[0]->shape;
    switch (n->op) {
    case Op::NEG: return {neg(g, loc)};                                   // d(-x) = -dx
    case Op::EXP2: return {mul(g, mul_c(out, LN2, loc), loc)};            // d 2^x = 2^x·ln2 dx
    case Op::LOG2: return {g / mul_c(src(0), LN2, loc)};                   // d log2 x = dx/(x·ln2)
    case Op::SIN: return {mul(g, src(0).cos(loc), loc)};                   // d sin x = cos x dx
    case Op::COS: return {neg(mul(g, src(0).sin(loc), loc), loc)};         // d cos x = -sin x dx
    case Op::SQRT: return {g / mul_c(out, 2, loc)};                        // d √x = dx/(2√x)
    case Op::RECIP: return {neg(mul(g, mul(out, out, loc), loc), loc)};    // d(1/x) = -dx/x²
    case Op::CAST: return {g.cast(n->src[0]->dtype, loc)};                 // d cast x = dx
    case Op::ADD: return {g, g};                                           // d(a+b) = da + db
    case Op::MUL: return {mul(g, src(1), loc), mul(g, src(0), loc)};       // d(ab) = b da + a db
    case Op::MAX: {   // d max(a,b) = [a>b] da + [a<b] db; a tie splits evenly, and with a
        // NaN (no order) both receive g, as in PyTorch: a gets 1 - [a<b] - ½[a=b], b likewise
        Tensor a = src(0), b = src(1), half_tie = mul_c((a == b).cast(dt, loc), 0.5, loc);
        auto share = [&](const Tensor& below) {
            return add_c(neg(add(below.cast(dt, loc), half_tie, loc), loc), 1, loc);
        };
        return {mul(g, share(a < b), loc), mul(g, share(b < a), loc)};
    }
    case Op::DIV:   // d(a/b) = da/b - ((a/b)/b)·db, as PyTorch's; integers: piecewise constant
        // a/b is computed again, not read: the quotient need not be stored for the gradient
        if (!dtype_is_float(dt)) return {};
        return {g / src(1), neg(mul(g, (src(0) / src(1)) / src(1), loc), loc)};
    case Op::CMPLT: case Op::CMPEQ: case Op::MOD:   // piecewise constant: 0
        return {};
    case Op::WHERE: {   // d where(c,a,b) = [c] da + [not c] db
        // relu's output passes relu's test (x <= 0) as x does: the gradient tests the output,
        // which is kept anyway, so x need not be (an MLP stores no pre-activation)
        Tensor c = is_relu(n.get()) ? out <= 0 : src(0);
        return {Tensor(), where(c, g, 0, loc), where(c, 0, g, loc)};
    }
    case Op::REDUCE_SUM: return {g.expand(in, loc)}; // each x_i adds to one sum
    case Op::REDUCE_MAX: {   // to the maxima (the NaNs, if any); ties share evenly, as PyTorch
        Tensor x = src(0);
        Tensor hit = add(x == out.expand(in, loc), x != x, loc).cast(dt, loc);
        std::vector<int> axes(n->arg.begin(), n->arg.end());
        Tensor count = hit.sum(axes, true, loc);
        return {mul(hit, (g / count).expand(in, loc), loc)};
    }
    case Op::RESHAPE: return {g.reshape(in, loc)};
    case Op::PERMUTE: {   // the inverse permutation
        std::vector<int> inverse(n->arg.size());
        for (size_t i = 0; i < n->arg.size(); i++) inverse[size_t(n->arg[i])] = int(i);
        return {g.permute(inverse, loc)};
    }
    case Op::EXPAND: {   // a broadcast input receives the sum over its copies
        std::vector<int> axes;
        for (size_t d = 0; d < in.size(); d++)
            if (in[d] == 1 && n->shape[d] != 1) axes.push_back(int(d));
        return {g.sum(axes, true, loc)};
    }
    case Op::PAD: {   // the inside of the padded gradient
        std::vector<std::pair<int64_t, int64_t>> box;
        for (size_t d = 0; d < in.size(); d++)
            box.push_back({n->arg[2 * d], n->arg[2 * d] + in[d]});
        return {g.shrink(box, loc)};
    }
    case Op::SHRINK: {   // zeros where the input was cut away
        std::vector<std::pair<int64_t, int64_t>> p;
        for (size_t d = 0; d < in.size(); d++)
            p.push_back({n->arg[2 * d], in[d] - n->arg[2 * d + 1]});
        return {g.pad(p, 0, loc)};
    }
    case Op::FLIP: return {g.flip(std::vector<int>(n->arg.begin(), n->arg.end()), loc)};
    case Op::GATHER: {   // scatter_add is gather's adjoint: each read sends its gradient back
        int axis = int(n->arg[0]);
        const NodeP& index = n->src[1];
        Shape one_pick = in;
        one_pick[size_t(axis)] = 1;
        if (index->shape == one_pick) {
            // one element picked per row (cross-entropy's label): the scatter into zeros is
            // a select, [j == index] g, which fuses into its reader instead of being a kernel
            Shape along(in.size(), 1);
            along[size_t(axis)] = in[size_t(axis)];
            Tensor j = Tensor::arange(in[size_t(axis)], loc).cast(index->dtype, loc);
            Tensor hit = j.reshape(along, loc).expand(in, loc) == wrap(index).expand(in, loc);
            return {where(hit, g.expand(in, loc), 0, loc), Tensor()};
        }
        return {wrap(node_make(Op::SCATTER_ADD, dt, in, {g.node(), index}, loc, n->arg)),
                Tensor()};
    }
    case Op::SCATTER_ADD:
        return {wrap(graph_gather(g.node(), n->src[1], int(n->arg[0]), loc)), Tensor()};
    case Op::SCATTER_MAX: {   // to the values that are their target's maximum (its NaNs, if
        // any); the ties at a target share evenly, as PyTorch's scatter_reduce "amax"
        int axis = int(n->arg[0]);
        Tensor x = src(0), reached = wrap(graph_gather(n, n->src[1], axis, loc));
        Tensor hit = (x == reached).maximum(x != x, loc).cast(dt, loc);
        Tensor count = wrap(node_make(Op::SCATTER_ADD, dt, n->shape, {hit.node(), n->src[1]},
                                      loc, n->arg));
        return {mul(hit, wrap(graph_gather((g / count).node(), n->src[1], axis, loc)), loc),
                Tensor()};
    }
    case Op::ASSIGN: return {};                                            // writes, not math
    case Op::CONTIGUOUS: return {g};
    default: return {};                                                    // sources: leaves
    }
}

// Gradients of output with respect to every node that requires grad, accumulated over paths;
// leaves (if given) receives the leaves reached, in graph order.
// Gradients by node (an eager step's backward makes a hundred); add() sums a path's part in.
struct Gradients : PointerMap<Node, Tensor, 8> {
    void add(const Node* n, Tensor g, Loc loc) {
        if (Tensor* had = find(n)) *had = detail::add(*had, g, loc);
        else insert(n, std::move(g));
    }
};
static Gradients backpropagate(const Tensor& output, const Tensor& seed_in,
                               std::vector<Node*>* leaves = nullptr) {
    const NodeP& root = output.node();
    if (!root->requires_grad)
        fail("backward: the tensor does not depend on any tensor that requires grad");
    Tensor seed = seed_in;
    if (!seed.defined()) {
        if (output.numel() != 1)
            fail(strf("backward: output of shape %s is not a scalar: pass a seed gradient of that "
                      "shape", shape_str(output.shape()).c_str()));
        seed = Tensor::ones(output.shape(), output.dtype());
    } else if (seed.shape() != output.shape()) {
        fail(strf("backward: seed gradient of shape %s does not match the output's shape %s",
                  shape_str(seed.shape()).c_str(), shape_str(output.shape()).c_str()));
    }
    PhaseScope phase(Phase::BACKWARD);
    Gradients grads;
    grads.add(root.get(), seed.cast(root->dtype), root->loc);
    std::vector<Node*> order = graph_toposort({root}, true);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
        Node* n = *it;
        Tensor* found = grads.find(n);
        if (!n->requires_grad || !found) continue;
        if (n->leaf) {   // a lazy leaf keeps its sources only to compute its value
            if (leaves) leaves->push_back(n);
            continue;
        }
        check_fresh(n);   // its rule reads its inputs as they were when it was built
        UserLocScope at(n->loc);
        std::vector<Tensor> in_grads = backward_rule(n->shared_from_this(), *found);
        for (size_t i = 0; i < in_grads.size(); i++) {
            Node* s = n->src[i].get();
            if (!in_grads[i].defined() || !s->requires_grad) continue;
            grads.add(s, in_grads[i].cast(s->dtype), s->loc);
        }
    }
    return grads;
}
}  // namespace detail

std::vector<Tensor> gradients(const Tensor& output, const std::vector<Tensor>& inputs,
                              const Tensor& seed, Loc loc) {
    UserLocScope at(loc);
    Gradients grads = backpropagate(output, seed);
    std::vector<Tensor> out;
    for (const Tensor& x : inputs) {
        Tensor* g = grads.find(x.node().get());
        out.push_back(g ? *g : Tensor::zeros(x.shape(), x.dtype()));
    }
    return out;
}

NoGrad::NoGrad() { no_grad_depth++; }
NoGrad::~NoGrad() { no_grad_depth--; }

// Any tensor that does not depend on a leaf can become one. A lazy leaf is computed with the
// next program (at once while a jit traces: the traced program must not compute it again).
Tensor& Tensor::requires_grad(bool on, Loc loc) {
    UserLocScope at(loc);
    Node& n = *node();
    if (on && !dtype_is_float(n.dtype))
        fail(strf("requires_grad: only float tensors can require gradients, got %s",
                  dtype_name(n.dtype)));
    if (n.requires_grad && !n.leaf)
        fail("requires_grad: the tensor is computed from tensors that require grad, so it is not "
             "a leaf; detach().requires_grad() makes a new leaf of its value");
    n.requires_grad = n.leaf = on;
    if (on && !n.buffer) {
        if (jit_capture) realize_nodes({node()}, true);
        else pending_leaves.push_back(node());
    }
    return *this;
}
bool Tensor::tracks_grad() const { return node()->requires_grad; }
Tensor Tensor::grad() const { return node()->grad ? Tensor(node()->grad) : Tensor(); }
void Tensor::zero_grad() { node()->grad.reset(); }
Tensor Tensor::detach() const {
    NodeP n = node_make(Op::RESHAPE, dtype(), shape(), {node()}, node()->loc);
    n->requires_grad = false;
    return wrap(n);
}

// Accumulates into every leaf's grad(). The output and the new gradients are realized with the
// next program (normally the optimizer's step), from the parameters before the update.
void Tensor::backward(const Tensor& seed, Loc loc) const {
    UserLocScope at(loc);
    Gradients grads;
    std::vector<Node*> leaves;
    {
        NoGrad no_grad;
        grads = backpropagate(*this, seed, &leaves);
    }
    pending_grads.targets.push_back(node());
    NoGrad no_grad;
    PhaseScope phase(Phase::BACKWARD);
    for (Node* n : leaves) {
        const Tensor& g = *grads.find(n);
        if (!n->grad || n->grad->buffer) pending_grads.leaves.push_back(n->shared_from_this());
        n->grad = n->grad ? add(wrap(n->grad), g, n->loc).node() : g.node();
        pending_grads.targets.push_back(n->grad);
    }
}

Tensor Tensor::assign(const Tensor& value, Loc loc) const {
    check_defined(*this, "assign", loc);
    if (!value.defined()) fail("assign: value is undefined", loc);
    if (broadcast_shape(shape(), value.shape(), "assign", loc) != shape())
        fail(strf("assign: value of shape %s does not fit target %s",
                  shape_str(value.shape()).c_str(), shape_str(shape()).c_str()),
             loc);
    if (!node()->buffer) realize_nodes({node()}, true);   // the target needs storage
    // a slice's rows share their tensor's buffer: as for any view, the assignment writes a
    // copy of the slice, not the tensor it came from
    if (node()->buffer->arena) node()->buffer = copy_buffer(*node()->buffer);
    Tensor v = value.cast(dtype(), loc).expand(shape(), loc);
    NodeP a = node_make(Op::ASSIGN, dtype(), shape(), {node(), v.node()}, loc);
    a->requires_grad = false;
    return wrap(a);
}

namespace detail {

TG_COLD_BEGIN   // to [LOOPIR]: once per new program, compiled unoptimized (Part C, top)
// ---- [SCHEDULE] which nodes get buffers; one kernel per stored node ------------------ >>schedule
// Input: the nodes to realize. Output: kernels in dependency order. A node is materialized
// (gets a buffer, is the root of a kernel) when it is a target, a CONTIGUOUS, an assignment or
// scatter, a reduction read by several kernels or through an index, or a computed value that
// the cost model says to store: read by several kernels, or at several indices (through a
// broadcast, or two paths) where computing it again costs more than RECOMPUTE_LIMIT, or
// where it is the only reader of a reduction that would be stored for it (x Wᵀ + b).
// Everything else is inlined into the kernels that read it, so elementwise chains fuse and
// broadcast operands stay stride-0 reads. A reduction read by one kernel runs inside it, and
// so does a value broadcast back over the rows it came from (sched.once): lowering computes
// it once per value, in the innermost loop its index depends on (softmax's row max and sum in
// the row loop, before the loop over the row), and where it cannot (the value would be
// recomputed inside a loop it does not depend on, or by consecutive iterations that read it
// at i / 2, as a max pool's gradient reads its windows') it asks for a buffer and the
// program is planned again (plan_program). An ASSIGN stores into its target's buffer:
// kernels that read the target's old value run before it, and a value that reads the target
// through a view is computed into a temporary first.
// Tests: tests/test_schedule.cpp (kernel counts for canonical graphs).

struct Kernel {
    Node* root = nullptr;              // the node whose value this kernel stores
};

struct Schedule {
    std::vector<NodeP> targets;
    std::vector<Kernel> kernels;                   // in dependency order
    std::unordered_set<Node*> materialized;        // roots of kernels
    // inlined on the condition that lowering computes them once per value (reductions inside a
    // kernel, values broadcast back): where it cannot, it asks for a buffer (plan_program)
    std::unordered_set<Node*> once;
    std::unordered_map<Node*, const char*> reason;   // why each root has a buffer (TG_DEBUG=2)
};

static bool is_elementwise(const Node* n) {
    OpKind k = op_kind(n->op);
    return k == OpKind::UNARY || k == OpKind::BINARY || k == OpKind::TERNARY;
}

static bool is_unit_reshape(const Node* n) {   // a reshape that only adds or drops size-1 axes
    if (n->op != Op::RESHAPE) return false;
    Shape a, b;
    for (int64_t d : n->shape) if (d != 1) a.push_back(d);
    for (int64_t d : n->src[0]->shape) if (d != 1) b.push_back(d);
    return a == b;
}

// Materialized nodes and buffers that a kernel reads: its inlined region ends at them.
static void sched_reads(Node* n, const std::unordered_set<Node*>& materialized, bool is_root,
                        std::unordered_set<Node*>& seen, std::unordered_set<Node*>& reads) {
    if (!seen.insert(n).second) return;
    if (!is_root && (n->buffer || materialized.count(n))) { reads.insert(n); return; }
    for (auto& src : n->src) sched_reads(src.get(), materialized, false, seen, reads);
}

// Does value, inlined, read target at another index than the one it writes (through a view)?
static bool reads_through_view(Node* n, Node* target, const std::unordered_set<Node*>& materialized,
                               bool below_view, std::unordered_set<Node*>& seen) {
    if (n == target) return below_view;
    if (n->buffer || materialized.count(n) || !seen.insert(n).second) return false;
    bool view =
        below_view || op_kind(n->op) == OpKind::MOVEMENT || op_kind(n->op) == OpKind::INDEXED;
    for (auto& src : n->src)
        if (reads_through_view(src.get(), target, materialized, view, seen)) return true;
    return false;
}

// Reads its operand at the index it writes: sharing such a path keeps one element per element.
static bool same_index_op(const Node* n) {
    return is_elementwise(n) || is_unit_reshape(n) || n->op == Op::CONTIGUOUS;
}

static const int64_t SCHED_MAX_DEPTH = 256;

// The cost model: about how many cycles an op costs per element, and the most a value read by
// one kernel at several indices may cost (its op and the inlined ops below it) to be computed
// again at each rather than stored once and loaded. A transcendental function is 8, so a chain
// such as softmax's e^(x - max) is recomputed; an op on a stored value or on a reduction's
// accumulator costs 1 per load. A value read through a broadcast is computed once per element
// it is broadcast to (a gradient in a matrix product's inner loop): only a few arithmetic ops
// (a mean: sum·1/n) are recomputed there. A value read by several kernels is recomputed in
// each only when it is plain arithmetic (see vectorizes_poorly) on the CPU: fused into a
// matrix product's kernel, a select, an exp2 or a libm call in its epilogue keeps GCC 12 from
// vectorizing the product (measured on W2: 2x slower). A device whose recomputes_calls() says
// so (CUDA) recomputes calls too, where that loads no more than the stored value would (see
// loads_below).
static const int64_t RECOMPUTE_LIMIT = 24, BROADCAST_RECOMPUTE_LIMIT = 4;
// On a device that recomputes calls, a value read by several kernels may cost this much, each
// op below it counted once (each kernel computes it once): an H200 loads a float in the time
// of about 28 multiply-adds, and a stored value is stored and loaded again. A GELU's tanh
// costs about 30 (over 100 counted per path, as `cost` counts).
static const int64_t KERNELS_RECOMPUTE_LIMIT = 48;
// Ops that keep GCC 12 from vectorizing a matrix product when its loop computes them too:
// libm calls, float32 2^x and log2 x (integer bit work), selects and the random hash.
static bool vectorizes_poorly(Op op) {
    return op == Op::EXP2 || op == Op::LOG2 || op == Op::SIN || op == Op::COS ||
           op == Op::SQRT || op == Op::WHERE || op == Op::RAND;
}
static int64_t op_cost(Op op) {
    switch (op) {
    case Op::EXP2: case Op::LOG2: case Op::SIN: case Op::COS: case Op::RAND: return 8;
    case Op::SQRT: case Op::RECIP: case Op::DIV: case Op::MOD: return 4;
    case Op::GATHER: return 2;
    case Op::CONST: case Op::ARANGE: return 0;
    default: return op_kind(op) == OpKind::MOVEMENT ? 0 : 1;
    }
}

// Whether an op inlined into the kernel that computes n (n's own or one below it, down to
// buffers and other kernels) is one that `is` names.
template <typename Is>
static bool inlined_any(Node* n, const std::unordered_set<Node*>& materialized, Is is) {
    std::vector<Node*> pending{n};
    std::unordered_set<Node*> seen{n};
    while (!pending.empty()) {
        Node* m = pending.back();
        pending.pop_back();
        if (is(m)) return true;
        for (auto& src : m->src)
            if (!src->buffer && !materialized.count(src.get()) && seen.insert(src.get()).second)
                pending.push_back(src.get());
    }
    return false;
}

// The loads below a value inside its kernel: buffers, other kernels' values and reductions.
// Of a value: those at its own index, not what it reads through a broadcast (a row's max).
// Of a kernel (from its root), leaving out what it reads through `apart`: the loads in the
// loops that read `apart` (a reduction's terms when it is one of them, not a row's max).
static std::unordered_set<Node*> loads_below(Node* top,
                                             const std::unordered_set<Node*>& materialized,
                                             const Node* apart = nullptr) {
    std::unordered_set<Node*> loads, seen;
    std::vector<Node*> pending;
    for (auto& src : top->src) pending.push_back(src.get());
    bool own_index = !apart;
    while (!pending.empty()) {
        Node* m = pending.back();
        pending.pop_back();
        if (m == apart || (own_index && m->op == Op::EXPAND) || !seen.insert(m).second) continue;
        bool reduces_apart = !own_index && op_kind(m->op) == OpKind::REDUCE && !m->buffer &&
                             !materialized.count(m) &&
                             inlined_any(m, materialized, [&](Node* q) { return q == apart; });
        if (!reduces_apart && (m->buffer || m->leaf || materialized.count(m) ||
                               op_kind(m->op) == OpKind::REDUCE)) {
            loads.insert(m);
            continue;
        }
        for (auto& src : m->src) pending.push_back(src.get());
    }
    return loads;
}

// store: values to keep in buffers although the cost model inlines them, each with the
// reason (lowering could not compute it once per value inside its reader; recomputed in each
// of its readers, it would load no less). recompute_calls: the device's recomputes_calls().
// store_next: values the next round should store (see plan_program); when there are any,
// the schedule returned is not complete. stored_alone: reductions in store that lowering
// could not compute inside the value stored in their place, asked for again.
static Schedule sched_build(const std::vector<NodeP>& targets,
                            const std::unordered_map<Node*, const char*>& store,
                            const std::unordered_set<Node*>& stored_alone,
                            bool recompute_calls, std::vector<Node*>& store_next) {
    Schedule s;
    std::unordered_set<Node*> is_target;
    for (const NodeP& t : targets)
        if (is_target.insert(t.get()).second && !t->buffer) s.targets.push_back(t);
    std::vector<Node*> order = graph_toposort(s.targets);
    std::unordered_map<const Buffer*, Node*> assigned;   // one assignment per buffer
    for (Node* n : order) {
        if (n->buffer) continue;
        check_fresh(n);
        if (n->op != Op::ASSIGN) continue;
        Node*& first = assigned[n->src[0]->buffer.get()];
        if (first)
            fail(strf("assign: two assignments to one %s %s buffer in one realize (at %s and %s): "
                      "realize the first before building the second",
                      dtype_name(n->dtype), shape_str(n->shape).c_str(),
                      loc_str(first->loc).c_str(), loc_str(n->loc).c_str()), n->loc);
        first = n;
    }
    std::unordered_map<Node*, std::vector<Node*>> users;
    for (Node* n : order)
        if (!n->buffer)
            for (auto& src : n->src) users[src.get()].push_back(n);
    // What recomputing each value would cost, sources first, as if everything below it were
    // recomputed too (an upper bound: shared parts count once per path). Buffers, the values
    // of reductions and sources too costly to recompute (they will be stored) cost a load.
    std::unordered_map<Node*, int64_t> cost;
    auto loaded = [](const Node* n) {
        return n->buffer || n->leaf || op_kind(n->op) == OpKind::REDUCE;
    };
    for (Node* n : order) {
        int64_t c = op_cost(n->op);
        for (auto& src : n->src) c += cost[src.get()] > RECOMPUTE_LIMIT ? 1 : cost[src.get()];
        cost[n] = loaded(n) ? 1 : std::min(c, RECOMPUTE_LIMIT + 1);
    }
    // On a device that recomputes calls: what computing each value in a kernel of its own
    // would cost, each op below it once, down to loads and to the values that cost more than
    // KERNELS_RECOMPUTE_LIMIT (they will be stored); past the limit, the limit + 1.
    std::unordered_map<Node*, int64_t> kernel_cost;
    if (recompute_calls)
        for (Node* n : order) {
            int64_t c = 0;
            std::vector<Node*> pending{n};
            std::unordered_set<Node*> seen{n};
            while (!pending.empty() && c <= KERNELS_RECOMPUTE_LIMIT) {
                Node* m = pending.back();
                pending.pop_back();
                bool below = m != n && (loaded(m) || kernel_cost[m] > KERNELS_RECOMPUTE_LIMIT);
                c += below ? 1 : op_cost(m->op);
                if (!below)
                    for (auto& src : m->src)
                        if (seen.insert(src.get()).second) pending.push_back(src.get());
            }
            kernel_cost[n] = loaded(n) ? 1 : std::min(c, KERNELS_RECOMPUTE_LIMIT + 1);
        }
    // Plain arithmetic: no call in the value's own ops, down to loads and to calls (a call
    // read by several kernels is stored), unless the device recomputes calls (a GELU's tanh
    // in the backward kernel that reads it, rather than three tensors of it stored and
    // loaded). Only such values are recomputed in several kernels. A gather is not plain:
    // recomputed inside a reduction, its bounds check sits in the reduction's inner loop (W1:
    // 0.1-0.2 us a step slower).
    auto stops_vectors = [&](Op op) { return !recompute_calls && vectorizes_poorly(op); };
    std::unordered_map<Node*, bool> plain;
    for (Node* n : order) {
        bool p = !stops_vectors(n->op) && op_kind(n->op) != OpKind::INDEXED;
        for (auto& src : n->src) {
            Node* sn = src.get();
            p = p && (loaded(sn) || stops_vectors(sn->op) || plain[sn]);
        }
        plain[n] = p;
    }
    // A reduction that a value alone reads, at the value's own index through elementwise
    // ops (a Linear's x Wᵀ under its + b), is stored for it when the value is recomputed in
    // several kernels, or asked for by lowering. Storing the value in its place stores no
    // more, computes the rest once (in the product's epilogue) and leaves each reader one
    // load where it had the reduction's and the rest's: attention's products read q + b and
    // k + b as plain tiles. Only plain values (see above): on the CPU a select or a call
    // would join the product's epilogue. reduction_read_only_by(n): that reduction, where n
    // reads exactly one so (else null), unless lowering asked for it again with n stored
    // (stored_alone).
    std::unordered_map<Node*, size_t> position;
    for (size_t i = 0; i < order.size(); i++) position[order[i]] = i;
    // The walk goes from n down, latest nodes first, through the nodes that only n reads
    // (each of their users one of them): what others read as well is not expanded, so a
    // walk stays near n (an LSTM's cell state, a chain through every step, is read by the
    // step's output too: walked to the bottom, each step's walk went back over all the
    // steps before it, and the schedule of a 32-step layer took seconds). Nodes
    // SCHED_MAX_DEPTH levels below n are not walked (they are cut into kernels of their own).
    auto reduction_read_only_by = [&](Node* n) -> Node* {
        auto later = [&](const std::pair<Node*, int64_t>& a, const std::pair<Node*, int64_t>& b) {
            return position[a.first] < position[b.first];
        };
        std::priority_queue<std::pair<Node*, int64_t>, std::vector<std::pair<Node*, int64_t>>,
                            decltype(later)>
            pending(later);   // a node and its depth below n
        std::unordered_set<Node*> seen{n}, through_n{n};   // through_n: read only through n
        auto walk_below = [&](Node* m, int64_t depth) {
            if (op_kind(m->op) == OpKind::REDUCE || depth + 1 >= SCHED_MAX_DEPTH) return;
            for (auto& src : m->src) {   // a reduction's terms are its own
                Node* sn = src.get();
                OpKind k = op_kind(sn->op);
                bool at_own_index = k == OpKind::REDUCE ? !stored_alone.count(sn)
                                                        : same_index_op(sn) && !store.count(sn);
                bool elsewhere = sn->buffer || sn->leaf || s.materialized.count(sn) ||
                                 is_target.count(sn) || !at_own_index;
                if (!elsewhere && seen.insert(sn).second) pending.push({sn, depth + 1});
            }
        };
        walk_below(n, 0);
        Node* found = nullptr;
        while (!pending.empty()) {
            auto [m, depth] = pending.top();
            pending.pop();
            bool only = true;
            for (Node* u : users[m]) only = only && through_n.count(u);
            if (!only) continue;
            through_n.insert(m);
            if (op_kind(m->op) == OpKind::REDUCE) {
                if (found) return nullptr;   // two sums in one kernel would not be tiled
                found = m;
            }
            walk_below(m, depth);
        }
        return found;
    };
    std::unordered_set<Node*> stored_in_place;   // reductions whose reader is stored instead
    // Decide users before sources. Where a node's value goes: the kernels (roots) it would be
    // inlined into, whether every path there reads it at the root's own index (elementwise
    // ops only), whether a path goes through a broadcast, how many paths there are (counted
    // up to 2) and how deep it would sit in its root's expression (the longest path).
    struct Reach {
        std::unordered_set<Node*> roots;
        bool same_index = true, broadcast = false, indexed = false, padded = false;
        int64_t paths = 0, depth = 0;
    };
    std::unordered_map<Node*, Reach> reach;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
        Node* n = *it;
        if (n->buffer) continue;
        Reach r;
        for (Node* u : users[n]) {
            if (s.materialized.count(u)) {
                r.roots.insert(u);
                r.same_index = r.same_index && op_kind(u->op) != OpKind::INDEXED;
                r.indexed = r.indexed || op_kind(u->op) == OpKind::INDEXED;
                r.paths = std::min<int64_t>(r.paths + 1, 2);
                r.depth = std::max<int64_t>(r.depth, 1);
                continue;
            }
            const Reach& ru = reach[u];
            r.roots.insert(ru.roots.begin(), ru.roots.end());
            r.same_index = r.same_index && ru.same_index && same_index_op(u);
            // a reduction inside a kernel reads each element once, however its own value is
            // broadcast: that broadcast does not reach below it
            bool reduces = op_kind(u->op) == OpKind::REDUCE;
            r.broadcast = r.broadcast || (ru.broadcast && !reduces) || u->op == Op::EXPAND;
            r.indexed = r.indexed || ru.indexed || op_kind(u->op) == OpKind::INDEXED;
            r.padded = r.padded || ru.padded || u->op == Op::PAD;
            r.paths = std::min<int64_t>(r.paths + ru.paths, 2);
            r.depth = std::max(r.depth, ru.depth + 1);
        }
        if (is_target.count(n)) r.paths = std::min<int64_t>(r.paths + 1, 2);
        reach[n] = r;
        OpKind k = op_kind(n->op);
        bool one_root = r.roots.size() == 1 && r.same_index && !is_target.count(n);
        if (one_root) reach[n].paths = 1;   // computed once per element of its root
        // A reduction read by one kernel only (not through an index) is computed inside it:
        // lowering nests its loops in the kernel's loops, where it is computed once per value
        // (inside a row loop when it is broadcast back over the row), or asks for a buffer.
        // Read through a pad, it would be computed over the padding too (the gradient of a
        // slice: W5's q, k, v products three times over).
        bool inner_reduce = k == OpKind::REDUCE && r.roots.size() == 1 && !r.indexed &&
                            !r.padded && !is_target.count(n) &&
                            (!store.count(n) || stored_in_place.count(n));
        if (inner_reduce) s.once.insert(n);
        bool computed = k != OpKind::SOURCE && k != OpKind::MOVEMENT && !n->buffer;
        // a comparison, a logical op on bools (x <= 0 is x < 0 or x == 0), a negation or a
        // cast costs less to compute again than to store and load
        bool cheap = n->op == Op::CMPLT || n->op == Op::CMPEQ || n->op == Op::NEG ||
                     n->op == Op::CAST || (n->dtype == DType::BOOL && is_elementwise(n));
        bool recompute =
            k != OpKind::REDUCE &&
            (r.roots.size() == 1 ? cost[n] <= RECOMPUTE_LIMIT
             : recompute_calls   ? plain[n] && kernel_cost[n] <= KERNELS_RECOMPUTE_LIMIT
                                 : plain[n] && cost[n] <= RECOMPUTE_LIMIT);
        Node* under = plain[n] && !one_root && !cheap && is_elementwise(n) && !store.count(n)
                          ? reduction_read_only_by(n)
                          : nullptr;
        bool in_place = under && (store.count(under) || (recompute && r.roots.size() > 1));
        if (in_place) stored_in_place.insert(under);
        bool inline_ok =
            !in_place && (one_root || cheap || (r.paths <= 1 && !r.broadcast) || recompute);
        // a gather read through a broadcast (an embedding read by a matrix product) is
        // stored: inlined, its bounds-checked load of a load keeps the product from tiles
        // (an evaluation of 04_makemore's model on 21,177 rows took 230 ms instead of 42)
        if (n->op == Op::GATHER && r.broadcast && !one_root) inline_ok = false;
        // read through a broadcast, it must be computed once per value of its own (out of
        // the loops it is broadcast over), unless it costs next to nothing
        if (inline_ok && !one_root && !cheap && r.broadcast &&
            cost[n] > BROADCAST_RECOMPUTE_LIMIT && computed && !store.count(n))
            s.once.insert(n);
        inline_ok = inline_ok && !store.count(n);
        // Lowering, the passes and the C compiler recurse over a kernel's expression: a long
        // chain is cut into kernels of bounded depth.
        bool too_deep = r.depth >= SCHED_MAX_DEPTH && !n->src.empty();
        const char* why = is_target.count(n)        ? "target"
                          : n->leaf                 ? "leaf"
                          : n->op == Op::CONTIGUOUS ? "explicit contiguous"
                          : k == OpKind::ASSIGN     ? "assign"
                          : op_kind(n->op) == OpKind::INDEXED && n->op != Op::GATHER
                              ? "scatter"
                          : too_deep                ? "expression too deep"
                          : in_place                ? "in place of the reduction it alone reads"
                          : store.count(n) && !inner_reduce ? store.at(n)
                          : nullptr;
        if (!why && k == OpKind::REDUCE && !inner_reduce)
            why = r.indexed  ? "reduction read through an index"
                  : r.padded ? "reduction read through a pad"
                             : "reduction read by 2+ kernels";
        if (!why && computed && !inline_ok && !inner_reduce)
            why = r.roots.size() > 1 ? "read by 2+ kernels"
                  : r.broadcast      ? "read through a broadcast, costly to recompute"
                                     : "read at two indices, costly to recompute";
        if (why) {
            s.materialized.insert(n);
            s.reason[n] = why;
        }
    }
    // On a device that recomputes calls, a value with calls computed again in several kernels
    // must read less there than its load would: each load at its index below it must be one
    // that each of those kernels makes anyway by another path. A GELU's tanh is computed from
    // h, which the GELU and its gradient read too (stored, the tanh, its sign and e^-2|z| were
    // three more loads). A softmax's e^(x - max) would load x where it loaded e and add the
    // exp2 (a polynomial of about 30 ops): on the H200 that made W7's softmax 67 -> 83 us
    // forward, 58 -> 87 backward. It is stored, in the next round.
    if (recompute_calls) {
        std::unordered_map<Node*, bool> has_call;
        for (Node* n : order) {
            bool c = vectorizes_poorly(n->op);
            for (auto& src : n->src) c = c || (!loaded(src.get()) && has_call[src.get()]);
            has_call[n] = c;
        }
        // the outermost such values: the ones below each are decided again with it stored
        std::unordered_set<Node*> below_stored;
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
            Node* n = *it;
            OpKind k = op_kind(n->op);
            bool decided = false;
            for (Node* u : users[n])
                decided = decided || (!s.materialized.count(u) && below_stored.count(u));
            if (decided) below_stored.insert(n);
            if (decided || !has_call[n] || s.materialized.count(n) || n->buffer ||
                k == OpKind::MOVEMENT || k == OpKind::SOURCE || reach[n].roots.size() < 2)
                continue;
            std::unordered_set<Node*> below = loads_below(n, s.materialized);
            bool reads_less = true;
            for (Node* root : reach[n].roots) {
                std::unordered_set<Node*> anyway = loads_below(root, s.materialized, n);
                for (Node* l : below) reads_less = reads_less && anyway.count(l);
            }
            if (!reads_less) {
                store_next.push_back(n);
                below_stored.insert(n);
            }
        }
        if (!store_next.empty()) return s;
    }
    // An assignment writes element i after reading element i. A value that reads its target
    // elsewhere (x.assign(x.flip(0))) gets a buffer of its own.
    for (Node* n : order) {
        Node* value = n->src.empty() ? nullptr : n->src.back().get();
        if (n->op != Op::ASSIGN || n->buffer || value->buffer || s.materialized.count(value))
            continue;
        std::unordered_set<Node*> seen;
        if (reads_through_view(value, n->src[0].get(), s.materialized, false, seen)) {
            s.materialized.insert(value);
            s.reason[value] = "reads its assignment's target at other indices";
        } else if (inlined_any(value, s.materialized,
                               [](Node* q) { return q->op == Op::GATHER; })) {
            // a failed bounds check must stop the program before the write, not after it
            s.materialized.insert(value);
            s.reason[value] = "bounds-checked value of an assignment";
        }
    }
    std::vector<Kernel> kernels;
    std::unordered_map<Node*, size_t> kernel_of;
    for (Node* n : order) {
        if (!s.materialized.count(n)) continue;
        kernel_of[n] = kernels.size();
        kernels.push_back(Kernel{n});
    }
    // Order: producers before consumers, and every kernel that reads a buffer's old value
    // before the assignment that overwrites it (Kahn's algorithm, ties in graph order).
    size_t nk = kernels.size();
    std::vector<std::vector<size_t>> after(nk);
    std::vector<int> waiting(nk, 0);
    std::unordered_map<Node*, std::vector<size_t>> readers;
    for (size_t i = 0; i < nk; i++) {
        std::unordered_set<Node*> seen, reads;
        sched_reads(kernels[i].root, s.materialized, true, seen, reads);
        for (Node* r : reads) {
            readers[r].push_back(i);
            auto p = kernel_of.find(r);
            if (p != kernel_of.end()) { after[p->second].push_back(i); waiting[i]++; }
        }
    }
    for (size_t i = 0; i < nk; i++) {
        Node* root = kernels[i].root;
        if (root->op != Op::ASSIGN) continue;
        for (size_t r : readers[root->src[0].get()])
            if (r != i) { after[r].push_back(i); waiting[i]++; }
    }
    std::vector<bool> done(nk, false);
    for (size_t emitted = 0; emitted < nk; emitted++) {
        // assignments as late as they can go: a failed bounds check stops the program before
        // it writes into existing buffers
        size_t next = nk;
        for (int pass = 0; pass < 2 && next == nk; pass++)
            for (size_t i = 0; i < nk && next == nk; i++)
                if (!done[i] && waiting[i] == 0 && (pass == 1 || kernels[i].root->op != Op::ASSIGN))
                    next = i;
        if (next == nk)
            fail("assign: a kernel needs both the old and the new value of an assigned buffer");
        done[next] = true;
        s.kernels.push_back(kernels[next]);
        for (size_t j : after[next]) waiting[j]--;
    }
    return s;
}

static std::string sched_listing(const Schedule& s) {
    std::string out;
    for (size_t i = 0; i < s.kernels.size(); i++) {
        const Kernel& k = s.kernels[i];
        out += strf("K%zu: %s %s %s", i, op_name(k.root->op), dtype_name(k.root->dtype),
                    shape_str(k.root->shape).c_str());
        out += "  " + loc_str(k.root->loc);
        auto why = s.reason.find(k.root);
        if (why != s.reason.end()) out += strf("  (%s)", why->second);
        out += "\n";
    }
    return out;
}

TG_COLD_END
// ---- [LOOPIR] loops, accumulators, stores; lowering kernels into them ------------------ >>loopir
// A Program (its types are declared in Part B, [DEVICE]) is blocks (one per kernel) of
// statements: LOOP over a variable of the block, ACC_INIT/ACC_UPDATE of a local accumulator,
// STORE of a value into a buffer at an index. Values and indices are expression trees (Expr),
// immutable and shared; statements are made by the st_* constructors below. Lowering walks a
// kernel's graph from its root carrying the index expression of every axis; views transform
// that index (this is where movement ops become strides, offsets and pad conditions), loads
// read buffers at it.
// alu_eval ([SHAPES]) is the executable meaning of every arithmetic op. Tests:
// tests/test_interp.cpp (against the compiled C and loops).

static Stmt st_loop(int var) {
    return Stmt{SK::LOOP, var, Op::REDUCE_SUM, DType::INDEX, nullptr, nullptr, {}};
}
static ExprP ex_const(double v, DType dt);
static double acc_identity(Op reduce_op, DType dt);
static Stmt st_acc_init(int acc, Op reduce_op, DType dt) {
    ExprP start = ex_const(acc_identity(reduce_op, dt), dt);
    return Stmt{SK::ACC_INIT, acc, reduce_op, dt, nullptr, start, {}};
}
// a local computed once: an accumulator that starts from a value and is never updated
static Stmt st_local(int acc, DType dt, ExprP value) {
    return Stmt{SK::ACC_INIT, acc, Op::REDUCE_SUM, dt, nullptr, std::move(value), {}};
}
static Stmt st_acc_update(int acc, Op reduce_op, DType dt, ExprP value) {
    return Stmt{SK::ACC_UPDATE, acc, reduce_op, dt, nullptr, std::move(value), {}};
}
// A float sum adds a product term x·y as one fused multiply-add, acc = fma(x, y, acc), rounded
// once: the interpreter, the C (scalar and tiled) and CUDA all do, so they keep the same bits,
// and the CPU's tiles run at the FMA units' rate.
static bool fused_term(const Stmt& st) {
    return st.kind == SK::ACC_UPDATE && st.op == Op::REDUCE_SUM && dtype_is_float(st.dtype) &&
           st.val->kind == EK::ALU && st.val->op == Op::MUL;
}
// buffer[idx] = value, or op= for STORE_ADD (REDUCE_SUM: +=, REDUCE_MAX: max=)
static Stmt st_store(int buffer, DType dt, ExprP idx, ExprP value, SK kind = SK::STORE,
                     Op op = Op::REDUCE_SUM) {
    return Stmt{kind, buffer, op, dt, std::move(idx), std::move(value), {}};
}
// a bounds check whose value nothing reads
static Stmt st_check(ExprP check) {
    return Stmt{SK::CHECK, 0, Op::REDUCE_SUM, DType::INDEX, std::move(check), nullptr, {}};
}

static ExprP ex_const(double v, DType dt) {
    return std::make_shared<const Expr>(Expr{EK::CONST, Op::CONST, dt, v, 0, 0, {}});
}
static ExprP ex_var(int id) {
    return std::make_shared<const Expr>(Expr{EK::VAR, Op::CONST, DType::INDEX, 0, id, 0, {}});
}
static ExprP ex_acc(int id, DType dt) {
    return std::make_shared<const Expr>(Expr{EK::ACC, Op::CONST, dt, 0, id, 0, {}});
}
static ExprP ex_load(int buf, DType dt, ExprP idx) {
    return std::make_shared<const Expr>(Expr{EK::LOAD, Op::CONST, dt, 0, buf, 0, {std::move(idx)}});
}
static ExprP ex_alu(Op op, DType dt, std::vector<ExprP> src) {
    return std::make_shared<const Expr>(Expr{EK::ALU, op, dt, 0, 0, 0, std::move(src)});
}
static ExprP ex_check(ExprP i, int64_t bound, int site) {
    return std::make_shared<const Expr>(
        Expr{EK::CHECK, Op::CONST, DType::INDEX, 0, site, bound, {std::move(i)}});
}
static ExprP ix(int64_t v) { return ex_const(double(v), DType::INDEX); }
static ExprP ix_add(ExprP a, ExprP b) {
    return ex_alu(Op::ADD, DType::INDEX, {std::move(a), std::move(b)});
}
static ExprP ix_mul(ExprP a, int64_t c) {
    return ex_alu(Op::MUL, DType::INDEX, {std::move(a), ix(c)});
}
static ExprP ix_lt(ExprP a, int64_t c) {
    return ex_alu(Op::CMPLT, DType::BOOL, {std::move(a), ix(c)});
}

static ExprP linear_index(const std::vector<ExprP>& idx, const Shape& shape) {
    Shape st = contiguous_strides(shape);
    ExprP out = ix(0);
    for (size_t d = 0; d < idx.size(); d++)
        if (shape[d] != 1) out = ix_add(out, ix_mul(idx[d], st[d]));
    return out;
}

// The index into `to` of the element that a reshape from `to` to `from` puts at `idx`:
// linearize over `from`, then split over `to`. The simplifier turns this back into plain
// variables whenever the reshape only splits or merges axes.
static std::vector<ExprP> reshape_index(const std::vector<ExprP>& idx, const Shape& from,
                                        const Shape& to) {
    ExprP lin = linear_index(idx, from);
    Shape st = contiguous_strides(to);
    std::vector<ExprP> out;
    for (size_t d = 0; d < to.size(); d++) {
        if (to[d] == 1) { out.push_back(ix(0)); continue; }
        ExprP q = ex_alu(Op::DIV, DType::INDEX, {lin, ix(st[d])});
        out.push_back(ex_alu(Op::MOD, DType::INDEX, {q, ix(to[d])}));
    }
    return out;
}

// The value an accumulator starts from: 0 for sums, the smallest value for maxima.
static double acc_identity(Op reduce_op, DType dt) {
    return reduce_op == Op::REDUCE_SUM ? 0 : lowest_value(dt);
}

// How many times each node of a DAG is read (its first reading visits its operands).
static void count_uses(const Expr* e, std::unordered_map<const Expr*, int>& uses) {
    if (uses[e]++) return;
    for (auto& s : e->src) count_uses(s.get(), uses);
}

// Calls visit once for each distinct part of e. Expressions are DAGs: walked as trees, the
// index of a long chain of reshapes takes exponential time.
using ExprSet = PointerIndex<Expr, 5>;
template <typename F> static void each_part(const ExprP& e, ExprSet& seen, F&& visit) {
    if (!e || !seen.insert(e.get())) return;
    visit(e);
    for (auto& s : e->src) each_part(s, seen, visit);
}

static bool expr_contains(const ExprP& e, const Expr* part) {
    bool found = false;
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& p) { found = found || p.get() == part; });
    return found;
}

// Results by input node, for the block whose loop extents it points to. The key's owner is
// kept alive beside it: a freed temporary's address could otherwise be reused by a new node
// and hit a stale entry.
struct SimplifyMemo {
    const std::vector<int64_t>* extents = nullptr;
    std::unordered_map<const Expr*, std::pair<ExprP, ExprP>> results;
};
static ExprP simplify(const ExprP& e, SimplifyMemo& memo);                          // [PASSES]
using ExprNames = std::unordered_map<const Expr*, std::string>;
static std::string expr_str(const ExprP& e, const ExprNames* names = nullptr);      // [PASSES]

static void vars_used(const ExprP& e, std::unordered_set<int>& vars) {
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        if (part->kind == EK::VAR) vars.insert(part->id);
    });
}
// The variables that e reads only divided by a constant (i / 2 but not i itself): e is the
// same for consecutive values of them.
static void vars_only_divided(const ExprP& e, std::unordered_set<int>& vars) {
    std::unordered_set<int> divided, plain;
    ExprSet seen[2];   // each part walked once outside a division and once inside (a DAG)
    std::function<void(const ExprP&, bool)> walk = [&](const ExprP& part, bool under) {
        if (!seen[under].insert(part.get())) return;
        if (part->kind == EK::VAR) (under ? divided : plain).insert(part->id);
        bool divides = part->kind == EK::ALU && part->op == Op::DIV &&
                       part->src[1]->kind == EK::CONST && part->src[1]->num > 1;
        for (const ExprP& src : part->src) walk(src, under || divides);
    };
    walk(e, false);
    for (int v : divided)
        if (!plain.count(v)) vars.insert(v);
}

// -- what a block reads and writes: the analysis the passes and the renderers share
struct Access {
    int buffer;
    ExprP idx;
    bool write;              // a STORE or STORE_ADD; else a load
    std::vector<int> loops;  // the loop variables around it, outermost first
};
struct BlockAccesses {
    std::vector<Access> accesses;
    bool checks = false;     // holds a bounds check
    bool reads(int buffer) const { return any(buffer, false); }
    bool writes(int buffer) const { return any(buffer, true); }
    bool any(int buffer, bool write) const {
        for (const Access& a : accesses)
            if (a.buffer == buffer && a.write == write) return true;
        return false;
    }
};
static void collect_accesses(const ExprP& e, std::vector<int>& loops, BlockAccesses& out) {
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        if (part->kind == EK::LOAD) out.accesses.push_back({part->id, part->src[0], false, loops});
        if (part->kind == EK::CHECK) out.checks = true;
    });
}
static void collect_accesses(const std::vector<Stmt>& body, std::vector<int>& loops,
                             BlockAccesses& out) {
    for (const Stmt& st : body) {
        collect_accesses(st.idx, loops, out);
        collect_accesses(st.val, loops, out);
        if (st.kind == SK::STORE || st.kind == SK::STORE_ADD)
            out.accesses.push_back({st.id, st.idx, true, loops});
        if (st.kind == SK::LOOP) {
            loops.push_back(st.id);
            collect_accesses(st.body, loops, out);
            loops.pop_back();
        }
    }
}
static BlockAccesses block_accesses(const Block& b) {
    BlockAccesses out;
    std::vector<int> loops;
    collect_accesses(b.body, loops, out);
    return out;
}

// -- substitution: e with each part for which replace() gives an expression replaced by it.
// Shared parts are rewritten once (done), so the result is a DAG like e.
using Replace = std::function<ExprP(const ExprP&)>;
using Rewritten = PointerMap<Expr, ExprP, 5>;   // each part rewritten so far: its result
static ExprP substitute(const ExprP& e, const Replace& replace, Rewritten& done) {
    if (!e) return e;
    if (const ExprP* hit = done.find(e.get())) return *hit;
    ExprP out = replace(e);
    if (!out) {
        std::vector<ExprP> src;
        bool changed = false;
        for (auto& s : e->src) {
            src.push_back(substitute(s, replace, done));
            changed = changed || src.back() != s;
        }
        if (changed) {
            Expr copy = *e;
            copy.src = std::move(src);
            out = std::make_shared<const Expr>(std::move(copy));
        } else {
            out = e;
        }
    }
    done.insert(e.get(), out);
    return out;
}
static void substitute(std::vector<Stmt>& body, const Replace& replace, Rewritten& done) {
    for (Stmt& st : body) {
        st.idx = substitute(st.idx, replace, done);
        st.val = substitute(st.val, replace, done);
        substitute(st.body, replace, done);
    }
}
// A loop variable by an expression (a loop fused into another, a peeled iteration).
static void substitute_var(std::vector<Stmt>& body, int var, const ExprP& by) {
    Rewritten done;
    substitute(body, [&](const ExprP& e) {
        return e->kind == EK::VAR && e->id == var ? by : nullptr;
    }, done);
}

TG_COLD_BEGIN   // lowering and the listings
// -- lowering one kernel of the schedule into a Block
struct Lowering {
    Program& prog;
    const Schedule& sched;
    std::unordered_map<Node*, int>& buffer_ids;
    Node* root = nullptr;
    std::vector<int64_t>* extents = nullptr;   // the loop variables of the block being built
    int naccs = 0;
    std::vector<Stmt>* body = nullptr;     // where accumulator loops go: the innermost loop
    std::vector<Node*> visited;            // for the block's title and origin
    // a node read twice at one index is lowered once: the expressions form a DAG (the
    // renderer names shared parts); the stored index keeps the key's pointers alive
    std::map<std::pair<Node*, std::vector<const Expr*>>, std::pair<std::vector<ExprP>, ExprP>>
        lowered;
    // Loops are opened outermost first; a reduction inside the kernel is computed in the
    // innermost open loop its index depends on, before the loop nested there (statements
    // collected in before_loop by that loop's variable, spliced in at the end).
    std::vector<int> open_loops;
    std::map<int, std::vector<Stmt>> before_loop;
    std::map<Node*, std::string> first_index;    // where each value of sched.once was computed
    std::map<std::pair<Node*, std::string>, ExprP> computed_at;   // and its local there
    SimplifyMemo index_memo;
    std::vector<Node*>* store_instead;           // values that must get buffers after all
    int inside_stored = 0;   // lowering a value noted in store_instead

    Lowering(Program& p, const Schedule& s, std::unordered_map<Node*, int>& ids,
             std::vector<Node*>* store)
        : prog(p), sched(s), buffer_ids(ids), store_instead(store) {}

    // An assignment stores into its target's buffer, so both nodes name the same buffer.
    int buffer_id(Node* n) {
        auto it = buffer_ids.find(n);
        if (it != buffer_ids.end()) return it->second;
        int id;
        if (n->op == Op::ASSIGN && !n->buffer) {
            id = buffer_id(n->src[0].get());
        } else {
            id = int(prog.buffers.size());
            prog.buffers.push_back({n->buffer ? ProgramBuffer::INPUT : ProgramBuffer::TEMP,
                                    n->dtype, shape_numel(n->shape)});
            prog.buffer_nodes.push_back(n);
        }
        buffer_ids[n] = id;
        return id;
    }

    // A gradient's scatter_add carries its gather's line: the error points at the indexing.
    int check_site(Node* n, const Node* src, size_t axis) {
        const char* what = n->op == Op::GATHER          ? "gather"
                           : n->phase == Phase::BACKWARD ? "gather (computing its gradient)"
                           : n->op == Op::SCATTER_MAX    ? "scatter"
                                                         : "scatter_add";
        prog.checks.push_back({strf("%s: index out of range [0, %lld) for source %s", what,
                                    (long long)src->shape[axis], shape_str(src->shape).c_str()),
                               n->loc});
        return int(prog.checks.size()) - 1;
    }

    ExprP lower(Node* n, const std::vector<ExprP>& idx) {
        if (n != root && (n->buffer || sched.materialized.count(n)))
            return ex_load(buffer_id(n), n->dtype, linear_index(idx, n->shape));
        std::pair<Node*, std::vector<const Expr*>> key{n, {}};
        for (auto& e : idx) key.second.push_back(e.get());
        auto hit = lowered.find(key);
        if (hit != lowered.end()) return hit->second.second;
        ExprP e = n != root && sched.once.count(n) ? lower_once(n, idx) : lower_new(n, idx);
        lowered[key] = {idx, e};
        return e;
    }

    ExprP lower_new(Node* n, const std::vector<ExprP>& idx) {
        visited.push_back(n);
        Node* s0 = n->src.empty() ? nullptr : n->src[0].get();
        switch (n->op) {
        case Op::CONST: return ex_const(n->value, n->dtype);
        case Op::ARANGE: return ex_alu(Op::CAST, DType::INT32, {idx[0]});
        case Op::RAND: {   // a source, if any, is added to the seed (nn::Dropout's count)
            ExprP seed = ix(int64_t(n->value));
            if (s0)
                seed = ex_alu(Op::ADD, DType::INDEX,
                              {seed, ex_alu(Op::CAST, DType::INDEX, {lower(s0, idx)})});
            return ex_alu(Op::RAND, DType::FLOAT32, {seed, linear_index(idx, n->shape)});
        }
        case Op::CONTIGUOUS: return lower(s0, idx);
        case Op::ASSIGN: return lower(n->src[1].get(), idx);   // stored into src[0]'s buffer
        case Op::RESHAPE: return lower(s0, reshape_index(idx, n->shape, s0->shape));
        case Op::PERMUTE: {
            std::vector<ExprP> si(idx.size());
            for (size_t i = 0; i < idx.size(); i++) si[size_t(n->arg[i])] = idx[i];
            return lower(s0, si);
        }
        case Op::EXPAND: {
            std::vector<ExprP> si = idx;
            for (size_t d = 0; d < idx.size(); d++)
                if (s0->shape[d] == 1) si[d] = ix(0);
            return lower(s0, si);
        }
        case Op::SHRINK: {
            std::vector<ExprP> si = idx;
            for (size_t d = 0; d < idx.size(); d++) si[d] = ix_add(idx[d], ix(n->arg[2 * d]));
            return lower(s0, si);
        }
        case Op::FLIP: {
            std::vector<ExprP> si = idx;
            for (int64_t d : n->arg)
                si[size_t(d)] = ix_add(ix(n->shape[size_t(d)] - 1), ix_mul(idx[size_t(d)], -1));
            return lower(s0, si);
        }
        case Op::PAD: {   // inside where before <= i < before + size, zero outside
            // Outside, the source index is clamped to 0 too: where() evaluates both sides, so
            // every load must stay in bounds.
            std::vector<ExprP> si = idx;
            std::vector<std::pair<ExprP, ExprP>> outside;   // (i < before, i < before + size)
            for (size_t d = 0; d < idx.size(); d++) {
                int64_t before = n->arg[2 * d], after = n->arg[2 * d + 1];
                if (before == 0 && after == 0) continue;
                ExprP below = before > 0 ? ix_lt(idx[d], before) : nullptr;
                ExprP inside = after > 0 ? ix_lt(idx[d], before + s0->shape[d]) : nullptr;
                ExprP i = ix_add(idx[d], ix(-before));
                if (inside) i = ex_alu(Op::WHERE, DType::INDEX, {inside, i, ix(0)});
                if (below) i = ex_alu(Op::WHERE, DType::INDEX, {below, ix(0), i});
                si[d] = i;
                outside.push_back({below, inside});
            }
            ExprP v = lower(s0, si), zero = ex_const(0, n->dtype);
            for (auto& [below, inside] : outside) {
                if (inside) v = ex_alu(Op::WHERE, n->dtype, {inside, v, zero});
                if (below) v = ex_alu(Op::WHERE, n->dtype, {below, zero, v});
            }
            return v;
        }
        case Op::GATHER: {   // the source read at idx with the gather axis taken from the index
            size_t axis = size_t(n->arg[0]);
            ExprP j = ex_alu(Op::CAST, DType::INDEX, {lower(n->src[1].get(), idx)});
            std::vector<ExprP> si = idx;
            ExprP checked = ex_check(j, s0->shape[axis], check_site(n, s0, axis));
            si[axis] = checked;
            ExprP v = lower(s0, si);
            if (!expr_contains(v, checked.get()))   // a source that ignores the index: check anyway
                body->push_back(st_check(checked));
            return v;
        }
        case Op::REDUCE_SUM:
        case Op::REDUCE_MAX: return lower_reduction(n, idx);
        default: break;
        }
        OpKind k = op_kind(n->op);
        if (k == OpKind::UNARY || k == OpKind::BINARY || k == OpKind::TERNARY) {
            std::vector<ExprP> args;
            for (auto& s : n->src) args.push_back(lower(s.get(), idx));
            return ex_alu(n->op, n->dtype, args);
        }
        fail(strf("lower: no lowering for %s", op_name(n->op)));
    }

    static constexpr int64_t SUM_BLOCK = 16;
    // A float sum is a tree of partial sums in a fixed order, so that its rounding error grows
    // with the logarithm of its length, not with the length: each reduced axis has its own
    // accumulator, and every accumulator adds at most SUM_BLOCK terms. A longer axis is cut
    // into blocks of SUM_BLOCK consecutive elements whose sums are summed the same way, with
    // the remainder as one last block. Σ over axes[k..] of src at si:
    ExprP lower_float_sum(Node* src, std::vector<ExprP> si, const std::vector<int64_t>& axes,
                          size_t k, DType dt) {
        if (k == axes.size()) return lower(src, si);
        size_t d = size_t(axes[k]);
        return lower_blocked_sum(dt, src->shape[d], [&](const ExprP& i) {
            si[d] = i;
            return lower_float_sum(src, si, axes, k + 1, dt);
        });
    }
    ExprP lower_blocked_sum(DType dt, int64_t extent, const std::function<ExprP(ExprP)>& term) {
        if (extent <= SUM_BLOCK) return lower_sum_loop(dt, extent, term);
        int64_t blocks = extent / SUM_BLOCK, tail = extent % SUM_BLOCK;
        ExprP total = lower_blocked_sum(dt, blocks, [&](const ExprP& b) {
            return lower_sum_loop(dt, SUM_BLOCK, [&](const ExprP& j) {
                return term(ix_add(ix_mul(b, SUM_BLOCK), j));
            });
        });
        if (tail) {
            ExprP last = lower_sum_loop(dt, tail, [&](const ExprP& j) {
                return term(ix_add(ix(blocks * SUM_BLOCK), j));
            });
            body->push_back(st_acc_update(total->id, Op::REDUCE_SUM, dt, last));
        }
        return total;
    }
    // acc = 0; for i < extent: acc += term(i)
    ExprP lower_sum_loop(DType dt, int64_t extent, const std::function<ExprP(ExprP)>& term) {
        int acc = naccs++, v = new_var(extent);
        body->push_back(st_acc_init(acc, Op::REDUCE_SUM, dt));
        body->push_back(st_loop(v));
        std::vector<Stmt>* outer = body;
        body = &body->back().body;
        open_loops.push_back(v);
        ExprP value = term(ex_var(v));
        open_loops.pop_back();
        body->push_back(st_acc_update(acc, Op::REDUCE_SUM, dt, value));
        body = outer;
        return ex_acc(acc, dt);
    }

    // A value in sched.once at idx, computed once per value: in the innermost open loop that
    // idx depends on (a softmax's row maximum in the row loop, before the loop over the row),
    // into an accumulator or a local. Recomputed inside a loop it does not depend on, or (a
    // reduction) needed at a second index, it is noted in store_instead: the kernel is planned
    // again with it in a buffer.
    ExprP lower_once(Node* n, const std::vector<ExprP>& idx_in) {
        // simplified, the index shows which loops it really depends on ((i1·3 + i2) / 3 is i1)
        std::vector<ExprP> idx;
        std::unordered_set<int> used;
        std::string where;
        for (const ExprP& e : idx_in) {
            idx.push_back(simplify(e, index_memo));
            vars_used(idx.back(), used);
            where += expr_str(idx.back(), nullptr) + ",";
        }
        auto done = computed_at.find({n, where});   // the same value reached by another path
        if (done != computed_at.end()) return done->second;
        int level = -1;   // position in open_loops of the innermost loop idx depends on
        for (size_t p = 0; p < open_loops.size(); p++)
            if (used.count(open_loops[p])) level = int(p);
        // wasted: computed again in a loop it does not depend on, or for each of consecutive
        // iterations that share it (read at i / 2: a max pool's gradient, from its window)
        std::unordered_set<int> divided;
        for (const ExprP& e : idx) vars_only_divided(e, divided);
        bool waste = false;
        for (int p = 0; p <= level; p++)
            waste = waste || !used.count(open_loops[size_t(p)]) ||
                    divided.count(open_loops[size_t(p)]);
        bool reduces = op_kind(n->op) == OpKind::REDUCE;
        auto [seen, first] = first_index.emplace(n, where);
        // Only the outermost such value is noted: stored, it takes the ones it reads out of this
        // kernel (a gradient's sum of terms through a matrix product's broadcast: the sum, not
        // its five partial sums). One it reads that is still wasteful is noted next round.
        bool store = store_instead && (waste || (reduces && !first && seen->second != where));
        if (store && !inside_stored) store_instead->push_back(n);
        inside_stored += store;
        ExprP value;
        if (size_t(level + 1) == open_loops.size()) {
            value = lower_new(n, idx);
        } else {   // computed before the loop nested in the one it depends on
            std::vector<int> nest = open_loops;
            std::vector<Stmt> hoisted, *outer = body;
            body = &hoisted;
            open_loops.resize(size_t(level + 1));
            value = lower_new(n, idx);
            if (!reduces) {
                int local = naccs++;
                body->push_back(st_local(local, n->dtype, value));
                value = ex_acc(local, n->dtype);
            }
            body = outer;
            open_loops = nest;
            std::vector<Stmt>& dst = before_loop[open_loops[size_t(level + 1)]];
            for (Stmt& st : hoisted) dst.push_back(std::move(st));
        }
        inside_stored -= store;
        computed_at[{n, where}] = value;
        return value;
    }

    // A reduction at idx, in *body: a tree of sums for floats, else one accumulator (exact in
    // any order) over the whole nest.
    ExprP lower_reduction(Node* n, const std::vector<ExprP>& idx) {
        Node* s0 = n->src[0].get();
        if (n->op == Op::REDUCE_SUM && dtype_is_float(n->dtype))
            return lower_float_sum(s0, idx, n->arg, 0, n->dtype);
        int acc = naccs++;
        body->push_back(st_acc_init(acc, n->op, n->dtype));
        std::vector<Stmt>* outer = body;
        std::vector<ExprP> si = idx;
        size_t opened = open_loops.size();
        for (int64_t d : n->arg) {
            int v = new_var(s0->shape[size_t(d)]);
            body->push_back(st_loop(v));
            body = &body->back().body;
            open_loops.push_back(v);
            si[size_t(d)] = ex_var(v);
        }
        body->push_back(st_acc_update(acc, n->op, n->dtype, lower(s0, si)));
        open_loops.resize(opened);
        body = outer;
        return ex_acc(acc, n->dtype);
    }

    // Moves each before_loop list in front of its loop (lists may hold loops with lists too).
    void splice_hoisted(std::vector<Stmt>& stmts) {
        std::vector<Stmt> out;
        for (Stmt& st : stmts) {
            if (st.kind == SK::LOOP) {
                auto it = before_loop.find(st.id);
                if (it != before_loop.end()) {
                    std::vector<Stmt> hoisted = std::move(it->second);
                    before_loop.erase(it);
                    splice_hoisted(hoisted);
                    for (Stmt& h : hoisted) out.push_back(std::move(h));
                }
                splice_hoisted(st.body);
            }
            out.push_back(std::move(st));
        }
        stmts = std::move(out);
    }

    int new_var(int64_t extent) {
        extents->push_back(extent);
        return int(extents->size()) - 1;
    }

    // Loops over shape in *body, one per axis longer than 1, left open: their indices.
    std::vector<ExprP> open_nest(const Shape& shape) {
        std::vector<ExprP> idx;
        for (int64_t extent : shape) {
            if (extent == 1) { idx.push_back(ix(0)); continue; }
            int v = new_var(extent);
            body->push_back(st_loop(v));
            body = &body->back().body;
            open_loops.push_back(v);
            idx.push_back(ex_var(v));
        }
        return idx;
    }

    Block lower_kernel(const Kernel& k, size_t index) {
        root = k.root;
        naccs = 0;
        visited.clear();
        lowered.clear();
        open_loops.clear();
        before_loop.clear();
        first_index.clear();
        computed_at.clear();
        int out = buffer_id(root);
        Block blk;
        body = &blk.body;
        extents = &blk.extents;
        index_memo = SimplifyMemo{&blk.extents, {}};
        std::vector<ExprP> loop_idx = open_nest(root->shape);
        if (root->op == Op::SCATTER_ADD || root->op == Op::SCATTER_MAX) {
            // the output from the identity (0, or the lowest value), then each value combined
            // into it at its index
            Op combine = root->op == Op::SCATTER_ADD ? Op::REDUCE_SUM : Op::REDUCE_MAX;
            visited.push_back(root);
            body->push_back(st_store(out, root->dtype, linear_index(loop_idx, root->shape),
                                     ex_const(acc_identity(combine, root->dtype), root->dtype)));
            Node* values = root->src[0].get();
            body = &blk.body;
            open_loops.clear();
            std::vector<ExprP> vidx = open_nest(values->shape);
            size_t axis = size_t(root->arg[0]);
            std::vector<ExprP> oidx = vidx;
            ExprP j = ex_alu(Op::CAST, DType::INDEX, {lower(root->src[1].get(), vidx)});
            oidx[axis] = ex_check(j, root->shape[axis], check_site(root, root, axis));
            body->push_back(st_store(out, root->dtype, linear_index(oidx, root->shape),
                                     lower(values, vidx), SK::STORE_ADD, combine));
        } else {
            ExprP val = lower(root, loop_idx);
            body->push_back(
                st_store(out, root->dtype, linear_index(loop_idx, root->shape), val));
        }
        splice_hoisted(blk.body);
        // title: the computing ops in graph order; origin: the user lines they came from
        std::string ops, origin;
        std::vector<std::string> seen_ops, seen_locs;
        for (auto it = visited.rbegin(); it != visited.rend(); ++it) {
            Node* n = *it;
            OpKind kind = op_kind(n->op);
            bool shown =
                kind != OpKind::MOVEMENT && kind != OpKind::SOURCE && n->op != Op::CONTIGUOUS;
            if (shown &&
                std::find(seen_ops.begin(), seen_ops.end(), op_name(n->op)) == seen_ops.end())
                seen_ops.push_back(op_name(n->op));
            std::string l = loc_str(n->loc);
            if (n->loc.file && std::find(seen_locs.begin(), seen_locs.end(), l) == seen_locs.end())
                seen_locs.push_back(l);
        }
        std::sort(seen_locs.begin(), seen_locs.end());
        for (auto& o : seen_ops) ops += " " + o;
        for (auto& l : seen_locs) origin += (origin.empty() ? "" : ", ") + l;
        blk.title =
            strf("K%zu %s %s %s:%s", index, phase_name(root->phase), dtype_name(root->dtype),
                 shape_str(root->shape).c_str(), ops.empty() ? " copy" : ops.c_str());
        blk.origin = origin;
        return blk;
    }
};

// check_finite (TG_CHECK=1): every kernel that stores floats is followed by a check that they
// are all finite; the first that is not stops the program and names the kernel and its line.
static Program lower_schedule(const Schedule& sched, std::unordered_map<Node*, int>& buffer_ids,
                              bool check_finite, std::vector<Node*>* store_instead) {
    Program prog;
    Lowering low(prog, sched, buffer_ids, store_instead);
    for (size_t i = 0; i < sched.kernels.size(); i++) {
        const Kernel& k = sched.kernels[i];
        int out = low.buffer_id(k.root);
        prog.buffers[size_t(out)].role = ProgramBuffer::TEMP;
        for (auto& t : sched.targets)
            if (t.get() == k.root) prog.buffers[size_t(out)].role = ProgramBuffer::OUTPUT;
        prog.blocks.push_back(low.lower_kernel(k, i));
        Block& b = prog.blocks.back();
        b.writes_in_place = k.root->op == Op::ASSIGN;
        if (k.root->op == Op::ASSIGN) prog.updates.push_back({out, k.root->loc});
        if (check_finite && dtype_is_float(k.root->dtype)) {
            b.finite_site = int(prog.checks.size());
            b.finite_buffer = out;
            b.finite_count = prog.buffers[size_t(out)].numel;
            prog.checks.push_back({"TG_CHECK: kernel " + b.title +
                                       (b.origin.empty() ? "" : " (from " + b.origin + ")") +
                                       " produced",
                                   k.root->loc, true});
        }
    }
    if (!sched.kernels.empty()) {
        const Node* last = sched.kernels.back().root;
        std::string file = last->loc.file ? loc_str(last->loc) : "expr";
        for (char& c : file)
            if (!std::isalnum((unsigned char)c)) c = '_';
        prog.name = file + "_" + op_name(last->op);
        std::transform(prog.name.begin(), prog.name.end(), prog.name.begin(), ::tolower);
    }
    return prog;
}

// Schedule and lower, again with the values in buffers that the schedule found would load no
// less recomputed in their readers, or that lowering could not compute once per value inside
// their reader (each round stores at least one more, or a reduction alone that was stored in
// place of its reader, so it ends; a round that asks for nothing new is an internal error).
static Program plan_program(const std::vector<NodeP>& targets, Schedule& sched,
                            std::unordered_map<Node*, int>& buffer_ids, bool check_finite,
                            bool recompute_calls) {
    std::unordered_map<Node*, const char*> store;
    std::unordered_set<Node*> stored_alone;
    while (true) {
        std::vector<Node*> more;
        sched = sched_build(targets, store, stored_alone, recompute_calls, more);
        for (Node* n : more) store[n] = "recomputed in each reader, it would load no less";
        if (!more.empty()) continue;
        buffer_ids.clear();
        Program prog = lower_schedule(sched, buffer_ids, check_finite, &more);
        if (more.empty()) return prog;
        // a reduction asked for again was stored in place of a value that reads it (see
        // reduction_read_only_by): it is stored alone next
        bool progress = false;
        for (Node* n : std::unordered_set<Node*>(more.begin(), more.end()))
            progress = store.emplace(n, "not computable once per value inside").second ||
                       (op_kind(n->op) == OpKind::REDUCE && stored_alone.insert(n).second) ||
                       progress;
        if (!progress)
            fail(strf("internal: lowering asks again for %s %s %s, stored already",
                      op_name(more[0]->op), dtype_name(more[0]->dtype),
                      shape_str(more[0]->shape).c_str()), more[0]->loc);
    }
}

// -- printing the IR
// a + b + c prints without the inner parentheses of the left-nested sum
static std::string unparen_sum(const ExprP& left, const std::string& text) {
    bool sum = left->kind == EK::ALU && left->op == Op::ADD && text.size() > 1 && text[0] == '(';
    return sum ? text.substr(1, text.size() - 2) : text;
}

// names: parts printed under a name of their own (see stmts_str)
static std::string expr_str(const ExprP& e, const ExprNames* names) {
    if (names) {
        auto named = names->find(e.get());
        if (named != names->end()) return named->second;
    }
    switch (e->kind) {
    case EK::CONST:
        if (e->dtype == DType::BOOL) return e->num != 0 ? "true" : "false";
        if (!dtype_is_float(e->dtype)) return strf("%lld", (long long)e->num);
        return strf("%g", e->num);
    case EK::VAR: return strf("i%d", e->id);
    case EK::ACC: return strf("acc%d", e->id);
    case EK::LOAD: return strf("buf%d[%s]", e->id, expr_str(e->src[0], names).c_str());
    case EK::CHECK:
        return strf("check(%s < %lld)", expr_str(e->src[0], names).c_str(), (long long)e->bound);
    case EK::ALU: break;
    }
    auto s = [&](size_t i) { return expr_str(e->src[i], names); };
    switch (e->op) {
    case Op::ADD: return "(" + unparen_sum(e->src[0], s(0)) + " + " + s(1) + ")";
    case Op::MUL: return s(0) + "*" + s(1);
    case Op::DIV: return "(" + s(0) + " / " + s(1) + ")";
    case Op::MOD: return "(" + s(0) + " % " + s(1) + ")";
    case Op::CMPLT: return "(" + s(0) + " < " + s(1) + ")";
    case Op::CMPEQ: return "(" + s(0) + " == " + s(1) + ")";
    case Op::NEG: return "-" + s(0);
    case Op::CAST: return std::string(dtype_name(e->dtype)) + "(" + s(0) + ")";
    default: break;
    }
    std::string out = op_name(e->op);
    std::transform(out.begin(), out.end(), out.begin(), ::tolower);
    out += "(";
    for (size_t i = 0; i < e->src.size(); i++) out += (i ? ", " : "") + s(i);
    return out + ")";
}

// Expressions are DAGs: a part used more than once in a statement is printed once, as
// t0 = ..., before the statement (as in the C), so a listing grows with the DAG, not its tree.
static void stmts_str(const std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                      int depth, std::string& out) {
    std::string pad(size_t(depth) * 2, ' ');
    for (const Stmt& st : body) {
        ExprNames names;
        std::unordered_map<const Expr*, int> uses;
        for (const ExprP& e : {st.idx, st.val})
            if (e) count_uses(e.get(), uses);
        std::function<void(const ExprP&)> name_shared = [&](const ExprP& e) {
            if (names.count(e.get()) || uses[e.get()] < 0) return;
            for (auto& s : e->src) name_shared(s);
            if (uses[e.get()] > 1 && e->kind == EK::ALU) {
                std::string name = strf("t%zu", names.size());
                out += pad + name + " = " + expr_str(e, &names) + "\n";
                names[e.get()] = name;
            }
            uses[e.get()] = -1;   // visited
        };
        for (const ExprP& e : {st.idx, st.val})
            if (e) name_shared(e);
        auto str = [&](const ExprP& e) { return expr_str(e, &names); };
        switch (st.kind) {
        case SK::LOOP:
            out += strf("%sfor i%d < %lld:\n", pad.c_str(), st.id,
                        (long long)extents[size_t(st.id)]);
            stmts_str(st.body, extents, depth + 1, out);
            break;
        case SK::ACC_INIT:
            out += strf("%sacc%d = %s\n", pad.c_str(), st.id, str(st.val).c_str());
            break;
        case SK::ACC_UPDATE:
            out += strf("%sacc%d %s %s\n", pad.c_str(), st.id,
                        st.op == Op::REDUCE_SUM ? "+=" : "max=", str(st.val).c_str());
            break;
        case SK::STORE:
        case SK::STORE_ADD:
            out += strf("%sbuf%d[%s] %s %s\n", pad.c_str(), st.id, str(st.idx).c_str(),
                        st.kind == SK::STORE ? "=" : st.op == Op::REDUCE_SUM ? "+=" : "max=",
                        str(st.val).c_str());
            break;
        case SK::CHECK: out += pad + str(st.idx) + "\n"; break;
        }
    }
}

static std::string program_listing(const Program& p) {
    std::string out;
    for (size_t i = 0; i < p.buffers.size(); i++) {
        static const char* roles[] = {"input", "output", "temp"};
        out += strf("buf%zu: %s %s[%lld]", i, roles[p.buffers[i].role],
                    dtype_name(p.buffers[i].dtype), (long long)p.buffers[i].numel);
        if (p.buffers[i].offset >= 0 && p.arena_bytes)
            out += strf(" at arena+%lld", (long long)p.buffers[i].offset);
        if (p.buffers[i].local_block >= 0)
            out += p.buffers[i].local_loop >= 0
                       ? strf(" local to loop i%d of K%d", p.buffers[i].local_loop,
                              p.buffers[i].local_block)
                       : strf(" local to K%d", p.buffers[i].local_block);
        out += "\n";
    }
    for (const Block& b : p.blocks) {
        out += b.title + (b.origin.empty() ? "" : "   (" + b.origin + ")");
        if (b.tile.rows)
            out += strf("   [tiles: %d x %d, panels of %lld columns, %lld tasks%s]", b.tile.rows,
                        b.tile.cols, (long long)b.tile.panel_cols, (long long)b.tile.tasks,
                        b.tile.piece_terms
                            ? strf(", sums in pieces of %lld terms",
                                   (long long)b.tile.piece_terms).c_str()
                            : "");
        if (b.parallel_chunks)
            out += strf("   [parallel: %lld chunks]", (long long)b.parallel_chunks);
        out += "\n";
        stmts_str(b.body, b.extents, 1, out);
    }
    return out;
}

TG_COLD_END
// ---- [PASSES] rewrites of the loop IR -------------------------------------------------- >>passes
// Each pass is a named function of the whole program, run in the order of PASSES; TG_PASSES
// picks which run (default all; none runs the IR as lowered, to bisect a wrong result):
//   simplify          constant folding and index algebra. It knows the range of every loop
//                     variable, so the / and % that views produce fold away whenever they are
//                     no-ops ((i0*16 + i1) / 16 → i0 when i1 < 16) or divide by a shared
//                     factor ((i0*32 + i1) / 64 → i0 / 2), a pad's edge is a comparison of
//                     its variable (i0 / 2 + 1 < 2 → i0 < 2), pad conditions that always
//                     hold disappear, bounds checks that cannot fail and loops of one iteration
//                     go. Sums are kept in a canonical order (variables by number), so the C
//                     reads like strided code written by hand.
//   fuse_loops        adjacent nests over the same extent become one, stepping over a nest in
//                     between (merge left or right, seed 004); the loops inside fuse too
//   fuse_maps         for a device without fuse_loops (CUDA): elementwise nests over the same
//                     loops become one, only where every level fuses (one grid still), and a
//                     map over a product's outputs joins its epilogue; then nests over the same
//                     rows (a layer norm's, a softmax's), where the GPU runs each row of the
//                     result on a group of threads
//   substitute_temps  a value stored and read back at the same index in one nest is read from
//                     a local
//   dead_stores       temporaries nobody reads are not stored; accumulators, locals and
//                     loops that only fed them go too
//   first_write       a short accumulation starts from its first term instead of zero
//   order_nests       each nest runs as early as what it reads allows, the one that frees the
//                     most temporary bytes first, so activations end where their last
//                     gradient is computed
//   local_temps       a temporary used in one nest only becomes an array of the loop whose
//                     iterations each use their own part of it (a row on the stack)
//   tile_products     a matrix product's nest (or a sum over rows) is computed in tiles of
//                     sums held in vector registers, each sum in its untiled order
//   sum_lanes         a long float sum runs as 16 lanes summed as a tree at the end
//   split_divided     a loop whose variable is divided by a constant d (a pool's gradient,
//                     i / 2 and i % 2) runs as a loop around one of d, and the division goes
//   split_at_edges    a loop whose body compares its variable with a constant (a pad's edge)
//                     runs as one loop per side, where the comparison is decided
//   parallel_loops    a nest of enough work whose outer iterations write disjoint parts is
//                     cut into fixed chunks that the thread pool runs (TG_THREADS)
//   plan_memory       temporaries share one arena by lifetime
// Analyses shared with the renderers: block_accesses ([LOOPIR]), range_of, Linear. Tests:
// tests/test_passes.cpp (each pass), tests/test_schedule.cpp, tests/test_interp.cpp,
// tests/test_oracle.cpp (random graphs against TG_PASSES=none on INTERP).

struct Range { int64_t lo = 0, hi = 0; bool known = false; };

static bool expr_eq(const ExprP& a, const ExprP& b) {
    if (a == b) return true;
    if (a->kind != b->kind || a->op != b->op || a->dtype != b->dtype || a->num != b->num ||
        a->id != b->id || a->bound != b->bound || a->src.size() != b->src.size())
        return false;
    for (size_t i = 0; i < a->src.size(); i++)
        if (!expr_eq(a->src[i], b->src[i])) return false;
    return true;
}

static bool is_const(const ExprP& e, double v) { return e->kind == EK::CONST && e->num == v; }

// A loop variable's values where a select has decided a comparison of it: a pad's clamped
// index (i < 256 ? 0 : i - 256) then has the range of its source axis.
struct VarRange { int var; int64_t lo, hi; };
static Range range_in(const ExprP& e, const std::vector<int64_t>& extents,
                      std::vector<VarRange>& narrowed) {
    switch (e->kind) {
    case EK::CONST: return {int64_t(e->num), int64_t(e->num), !dtype_is_float(e->dtype)};
    case EK::VAR:
        for (auto n = narrowed.rbegin(); n != narrowed.rend(); ++n)
            if (n->var == e->id) return {n->lo, n->hi, true};
        return {0, extents[size_t(e->id)] - 1, true};
    case EK::CHECK: return {0, e->bound - 1, true};
    case EK::LOAD: case EK::ACC: return {0, 1, e->dtype == DType::BOOL};
    case EK::ALU: break;
    }
    if (dtype_is_float(e->dtype)) return {};
    auto r = [&](size_t i) { return range_in(e->src[i], extents, narrowed); };
    switch (e->op) {
    case Op::CMPLT: case Op::CMPEQ: return {0, 1, true};
    case Op::CAST: return dtype_is_float(e->src[0]->dtype) ? Range{} : r(0);
    case Op::ADD: {
        Range a = r(0), b = r(1);
        return {a.lo + b.lo, a.hi + b.hi, a.known && b.known};
    }
    case Op::MUL: {
        Range a = r(0), b = r(1);
        if (!a.known || !b.known) return {};
        int64_t p[] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
        return {*std::min_element(p, p + 4), *std::max_element(p, p + 4), true};
    }
    case Op::DIV: case Op::MOD: {
        Range a = r(0);
        if (e->src[1]->kind != EK::CONST || e->src[1]->num <= 0 || !a.known || a.lo < 0) return {};
        int64_t c = int64_t(e->src[1]->num);
        if (e->op == Op::DIV) return {a.lo / c, a.hi / c, true};
        return {0, std::min(a.hi, c - 1), true};
    }
    case Op::WHERE: {
        const ExprP& cond = e->src[0];
        if (cond->kind == EK::ALU && cond->op == Op::CMPLT && cond->src[0]->kind == EK::VAR &&
            cond->src[1]->kind == EK::CONST) {   // var < c ? a : b
            Range v = range_in(cond->src[0], extents, narrowed), a, b;
            int64_t c = int64_t(cond->src[1]->num);
            auto branch = [&](size_t i, int64_t lo, int64_t hi) {
                if (lo > hi) return Range{};   // never taken
                narrowed.push_back({cond->src[0]->id, lo, hi});
                Range out = r(i);
                narrowed.pop_back();
                return out;
            };
            a = branch(1, v.lo, std::min(v.hi, c - 1));
            b = branch(2, std::max(v.lo, c), v.hi);
            if (v.lo >= c) return b;
            if (v.hi < c) return a;
            return {std::min(a.lo, b.lo), std::max(a.hi, b.hi), a.known && b.known};
        }
        Range a = r(1), b = r(2);
        return {std::min(a.lo, b.lo), std::max(a.hi, b.hi), a.known && b.known};
    }
    default: return {};
    }
}
static Range range_of(const ExprP& e, const std::vector<int64_t>& extents) {
    std::vector<VarRange> narrowed;
    return range_in(e, extents, narrowed);
}

// An index sum as Σ coef·term + constant.
struct Linear {
    std::vector<std::pair<int64_t, ExprP>> terms;
    int64_t constant = 0;
    void add(int64_t coef, const ExprP& e) {
        if (e->kind == EK::CONST) { constant += coef * int64_t(e->num); return; }
        if (e->kind == EK::ALU && e->dtype == DType::INDEX && e->op == Op::ADD) {
            add(coef, e->src[0]);
            add(coef, e->src[1]);
            return;
        }
        if (e->kind == EK::ALU && e->dtype == DType::INDEX && e->op == Op::MUL) {
            if (e->src[1]->kind == EK::CONST) return add(coef * int64_t(e->src[1]->num), e->src[0]);
            if (e->src[0]->kind == EK::CONST) return add(coef * int64_t(e->src[0]->num), e->src[1]);
        }
        for (auto& t : terms)
            if (expr_eq(t.second, e)) { t.first += coef; return; }
        terms.push_back({coef, e});
    }
    // (x / c)·c·k + (x % c)·k = x·k
    bool fold_div_mod() {
        for (size_t i = 0; i < terms.size(); i++) {
            const ExprP& d = terms[i].second;
            if (d->kind != EK::ALU || d->op != Op::DIV || d->src[1]->kind != EK::CONST) continue;
            int64_t c = int64_t(d->src[1]->num);
            for (size_t j = 0; j < terms.size(); j++) {
                const ExprP& m = terms[j].second;
                if (m->kind != EK::ALU || m->op != Op::MOD || !is_const(m->src[1], double(c)) ||
                    !expr_eq(m->src[0], d->src[0]) || terms[i].first != terms[j].first * c)
                    continue;
                int64_t k = terms[j].first;
                ExprP x = d->src[0];
                terms.erase(terms.begin() + long(std::max(i, j)));
                terms.erase(terms.begin() + long(std::min(i, j)));
                add(k, x);
                return true;
            }
        }
        return false;
    }
    ExprP build() const {
        std::vector<std::pair<int64_t, ExprP>> ts;
        for (auto& t : terms)
            if (t.first != 0) ts.push_back(t);
        std::stable_sort(ts.begin(), ts.end(), [](auto& a, auto& b) {
            bool va = a.second->kind == EK::VAR, vb = b.second->kind == EK::VAR;
            if (va != vb) return va;
            return va && a.second->id < b.second->id;
        });
        ExprP out;
        for (auto& [coef, term] : ts) {
            ExprP t = coef == 1 ? term : ix_mul(term, coef);
            out = out ? ix_add(out, t) : t;
        }
        if (!out) return ix(constant);
        return constant ? ix_add(out, ix(constant)) : out;
    }
};

static ExprP simplify(const ExprP& e, SimplifyMemo& memo);

static int64_t floor_div(int64_t a, int64_t b) {   // b > 0
    return a / b - (a % b < 0);
}
// An index compared with a constant, s·x + k < c (s > 0), as x alone against a constant,
// and x / d < c (x >= 0) as x < c·d: a pad's edge read through a reshape (i / 2 + 1 < 2)
// becomes a comparison of the loop variable (i < 2), which narrows the variable's range in
// the select's branches (range_in) and is an edge split_at_edges finds. Null: nothing to do.
static ExprP compared_alone(const ExprP& e, SimplifyMemo& memo) {
    const auto& s = e->src;
    if (s[0]->dtype != DType::INDEX || s[1]->kind != EK::CONST) return nullptr;
    Linear lin;
    lin.add(1, s[0]);
    if (lin.terms.size() != 1 || lin.terms[0].first <= 0) return nullptr;
    const int64_t scale = lin.terms[0].first;
    ExprP x = lin.terms[0].second;
    // s·x + k < c ⇔ x < ⌈(c - k) / s⌉
    int64_t bound = floor_div(int64_t(s[1]->num) - lin.constant + scale - 1, scale);
    bool changed = scale != 1 || lin.constant != 0;
    if (x->kind == EK::ALU && x->op == Op::DIV && x->src[1]->kind == EK::CONST &&
        x->src[1]->num > 0) {
        Range r = range_of(x->src[0], *memo.extents);
        if (r.known && r.lo >= 0) {
            bound *= int64_t(x->src[1]->num);
            x = x->src[0];
            changed = true;
        }
    }
    return changed ? ix_lt(x, bound) : nullptr;
}

static ExprP simplify_node(const ExprP& e, SimplifyMemo& memo) {
    auto again = [&](const ExprP& x) { return simplify(x, memo); };
    if (e->kind == EK::CHECK) {
        Range r = range_of(e->src[0], *memo.extents);
        return r.known && r.lo >= 0 && r.hi < e->bound ? e->src[0] : e;
    }
    if (e->kind != EK::ALU) return e;
    const auto& s = e->src;
    bool all_const =
        std::all_of(s.begin(), s.end(), [](const ExprP& x) { return x->kind == EK::CONST; });
    if (all_const) {
        Num v[3];
        for (size_t i = 0; i < s.size(); i++) v[i] = num_of(s[i]->num, s[i]->dtype);
        Num r = alu_eval(e->op, e->dtype, s[0]->dtype, v);
        const int64_t exact = int64_t(1) << 53;   // a constant holds its value as a double
        if (!dtype_is_float(e->dtype) && (r.i > exact || r.i < -exact)) return e;
        return ex_const(num_double(r, e->dtype), e->dtype);
    }
    switch (e->op) {
    case Op::WHERE:
        if (s[0]->kind == EK::CONST) return s[0]->num != 0 ? s[1] : s[2];
        if (expr_eq(s[1], s[2])) return s[1];
        return e;
    case Op::CAST: return s[0]->dtype == e->dtype ? s[0] : e;
    case Op::NEG: return s[0]->kind == EK::ALU && s[0]->op == Op::NEG ? s[0]->src[0] : e;
    case Op::CMPLT: {
        Range a = range_of(s[0], *memo.extents), b = range_of(s[1], *memo.extents);
        if (a.known && b.known && a.hi < b.lo) return ex_const(1, DType::BOOL);
        if (a.known && b.known && a.lo >= b.hi) return ex_const(0, DType::BOOL);
        ExprP alone = compared_alone(e, memo);
        return alone ? again(alone) : e;
    }
    default: break;
    }
    if (e->dtype != DType::INDEX) {   // float and int arithmetic: only exact identities
        if (e->op == Op::MUL && is_const(s[1], 1)) return s[0];
        if (e->op == Op::MUL && is_const(s[0], 1)) return s[1];
        bool integer = !dtype_is_float(e->dtype);   // x + 0 = x except for x = -0.0
        if (e->op == Op::ADD && integer && is_const(s[1], 0)) return s[0];
        if (e->op == Op::ADD && integer && is_const(s[0], 0)) return s[1];
        return e;
    }
    if (e->op == Op::ADD || e->op == Op::MUL) {
        Linear lin;
        lin.add(1, e);
        while (lin.fold_div_mod()) {}
        return lin.build();
    }
    if ((e->op != Op::DIV && e->op != Op::MOD) || s[1]->kind != EK::CONST || s[1]->num <= 0)
        return e;
    int64_t c = int64_t(s[1]->num);
    Range r = range_of(s[0], *memo.extents);
    if (e->op == Op::DIV && c == 1) return s[0];
    if (e->op == Op::MOD && c == 1) return ix(0);
    if (r.known && r.lo >= 0 && r.hi < c) return e->op == Op::DIV ? ix(0) : s[0];
    if (!r.known || r.lo < 0) return e;
    // (x / a) / b = x / (a·b) for x >= 0
    if (e->op == Op::DIV && s[0]->kind == EK::ALU && s[0]->op == Op::DIV &&
        s[0]->src[1]->kind == EK::CONST)
        return again(
            ex_alu(Op::DIV, DType::INDEX, {s[0]->src[0], ix(c * int64_t(s[0]->src[1]->num))}));
    // (q·c + r) / c = q + r / c and (q·c + r) % c = r % c, for x >= 0 and r >= 0
    Linear lin, quotient, rest;
    lin.add(1, s[0]);
    for (auto& t : lin.terms) {
        if (t.first % c == 0) quotient.terms.push_back({t.first / c, t.second});
        else rest.terms.push_back(t);
    }
    quotient.constant = lin.constant >= 0 ? lin.constant / c : 0;
    rest.constant = lin.constant >= 0 ? lin.constant % c : lin.constant;
    bool moved = !quotient.terms.empty() || quotient.constant != 0;
    if (!moved) {
        // (g·q + s) / c = q / (c/g) and (g·q + s) % c = (q % (c/g))·g + s, where g divides
        // c and 0 <= s < g: a row of 32 read in pairs of rows, (i·32 + j) / 64, is i / 2
        int64_t best = 1;
        Linear multiple, small;
        for (auto& t : lin.terms) {
            int64_t g = std::gcd(t.first, c);
            if (g <= best) continue;
            Linear m, sm;
            for (auto& u : lin.terms) {
                if (u.first % g == 0) m.terms.push_back({u.first / g, u.second});
                else sm.terms.push_back(u);
            }
            m.constant = floor_div(lin.constant, g);
            sm.constant = lin.constant - g * m.constant;
            Range sr = range_of(sm.build(), *memo.extents);
            if (!sr.known || sr.lo < 0 || sr.hi >= g) continue;
            best = g;
            multiple = m;
            small = sm;
        }
        if (best > 1) {
            ExprP q = multiple.build(), n = ix(c / best);
            if (e->op == Op::DIV) return again(ex_alu(Op::DIV, DType::INDEX, {q, n}));
            ExprP remainder = ex_alu(Op::MOD, DType::INDEX, {q, n});
            return again(ix_add(ix_mul(remainder, best), small.build()));
        }
    }
    ExprP rest_e = rest.build();
    Range rr = range_of(rest_e, *memo.extents);
    if (!moved || !rr.known || rr.lo < 0) return e;
    if (e->op == Op::MOD) return again(ex_alu(Op::MOD, DType::INDEX, {rest_e, ix(c)}));
    return again(ix_add(quotient.build(), ex_alu(Op::DIV, DType::INDEX, {rest_e, ix(c)})));
}

static ExprP simplify(const ExprP& e, SimplifyMemo& memo) {
    if (!e) return e;
    auto it = memo.results.find(e.get());
    if (it != memo.results.end()) return it->second.second;
    ExprP cur = e;
    if (!e->src.empty()) {
        std::vector<ExprP> src;
        bool changed = false;
        for (auto& x : e->src) {
            src.push_back(simplify(x, memo));
            changed = changed || src.back() != x;
        }
        if (changed) {
            Expr copy = *e;
            copy.src = std::move(src);
            cur = std::make_shared<const Expr>(std::move(copy));
        }
    }
    ExprP out = simplify_node(cur, memo);
    memo.results[e.get()] = {e, out};
    return out;
}

static void simplify_stmts(std::vector<Stmt>& body, SimplifyMemo& memo) {
    for (size_t p = 0; p < body.size();) {   // a loop of one iteration is its body at 0
        if (body[p].kind != SK::LOOP || (*memo.extents)[size_t(body[p].id)] != 1) { p++; continue; }
        std::vector<Stmt> inner = std::move(body[p].body);
        substitute_var(inner, body[p].id, ix(0));
        body.erase(body.begin() + std::ptrdiff_t(p));
        body.insert(body.begin() + std::ptrdiff_t(p), std::make_move_iterator(inner.begin()),
                    std::make_move_iterator(inner.end()));
    }
    for (Stmt& st : body) {
        st.idx = simplify(st.idx, memo);
        st.val = simplify(st.val, memo);
        simplify_stmts(st.body, memo);
    }
    body.erase(std::remove_if(body.begin(), body.end(), [](const Stmt& st) {   // cannot fail
        return st.kind == SK::CHECK && st.idx->kind != EK::CHECK;
    }), body.end());
}

static void pass_simplify(Program& p) {
    for (Block& b : p.blocks) {
        SimplifyMemo memo{&b.extents, {}};
        simplify_stmts(b.body, memo);
    }
}

// -- renumbering: the variables and accumulators of one block moved into another
static int accumulators_used(const std::vector<Stmt>& body) {
    int n = 0;
    ExprSet seen;
    auto in_expr = [&](const ExprP& e) {
        each_part(e, seen, [&](const ExprP& part) {
            if (part->kind == EK::ACC) n = std::max(n, part->id + 1);
        });
    };
    for (const Stmt& st : body) {
        if (st.kind == SK::ACC_INIT || st.kind == SK::ACC_UPDATE) n = std::max(n, st.id + 1);
        in_expr(st.idx);
        in_expr(st.val);
        n = std::max(n, accumulators_used(st.body));
    }
    return n;
}
// Loop variables and accumulators by new numbers: var_of(v), acc_of(a).
using Renumbering = std::function<int(int)>;
static void renumber(std::vector<Stmt>& body, const Renumbering& var_of,
                     const Renumbering& acc_of) {
    Rewritten done;
    substitute(body, [&](const ExprP& e) -> ExprP {
        if (e->kind == EK::VAR) return ex_var(var_of(e->id));
        if (e->kind == EK::ACC) return ex_acc(acc_of(e->id), e->dtype);
        return nullptr;
    }, done);
    std::function<void(std::vector<Stmt>&)> ids = [&](std::vector<Stmt>& stmts) {
        for (Stmt& st : stmts) {
            if (st.kind == SK::LOOP) st.id = var_of(st.id);
            if (st.kind == SK::ACC_INIT || st.kind == SK::ACC_UPDATE) st.id = acc_of(st.id);
            ids(st.body);
        }
    };
    ids(body);
}
// moved after a's: b's variables as var_of says, its accumulators after a's
static void renumber_after(std::vector<Stmt>& moved, const std::vector<int>& var_of,
                           const Block& a) {
    int acc_offset = accumulators_used(a.body);
    renumber(moved, [&](int v) { return var_of[size_t(v)]; },
             [&](int acc) { return acc + acc_offset; });
}


// The accumulators a body reads, and those it sets (ACC_INIT, ACC_UPDATE; those it starts:
// ACC_INIT alone).
static void accs_read(const Stmt& st, std::unordered_set<int>& read, ExprSet& seen) {
    for (const ExprP* e : {&st.idx, &st.val})
        each_part(*e, seen, [&](const ExprP& part) {
            if (part->kind == EK::ACC) read.insert(part->id);
        });
    for (const Stmt& inner : st.body) accs_read(inner, read, seen);
}
static void accs_read(const Stmt& st, std::unordered_set<int>& read) {
    ExprSet seen;
    accs_read(st, read, seen);
}
static void accs_read(const std::vector<Stmt>& body, std::unordered_set<int>& read) {
    ExprSet seen;
    for (const Stmt& st : body) accs_read(st, read, seen);
}
static void accs_set(const Stmt& st, std::unordered_set<int>& set, bool started = false) {
    if (st.kind == SK::ACC_INIT || (st.kind == SK::ACC_UPDATE && !started)) set.insert(st.id);
    for (const Stmt& inner : st.body) accs_set(inner, set, started);
}
static void accs_set(const std::vector<Stmt>& body, std::unordered_set<int>& set,
                     bool started = false) {
    for (const Stmt& st : body) accs_set(st, set, started);
}

// the accumulators that sum trees update or add into others
static void accs_in_trees(const std::vector<Stmt>& body, std::unordered_set<int>& set) {
    for (const Stmt& st : body) {
        if (st.kind == SK::ACC_UPDATE) {
            set.insert(st.id);
            accs_read(st, set);
        }
        accs_in_trees(st.body, set);
    }
}

// How nests are shared out to threads: pass_tile_products, pass_parallel_loops.
static const int64_t PARALLEL_MIN_WORK = int64_t(1) << 16, PARALLEL_CHUNKS = 16;
// The least work of a nest that runs on threads: `usual`, or TG_PARALLEL_MIN_WORK for every
// kind of nest (the oracle's thread check sets 1, so that tiny nests run in chunks too).
static int64_t parallel_min_work(int64_t usual) {
    return env_int("TG_PARALLEL_MIN_WORK", int(usual), 1, INT32_MAX);
}

// -- pass_tile_products: matrix products as register tiles over packed operands
// A nest whose output loops each hold only the next, and whose innermost one holds sum trees
// of products followed by stores,
//     for o..: for i: for j: { acc trees of Σ x(i, k)·y(k, j) };  out[..] = f(accs, loads)
// where x never reads j and y never reads i, is computed in tiles of sums held in vector
// registers: each term multiplies one value of x by a vector of y's columns (operands read in
// place or packed: c_tiled_product), so each multiply and add serves a whole vector of
// outputs. A nest whose terms are y alone, read along the columns (a bias's gradient: a sum
// over rows), is a product without rows. Every element's sum is the same tree, its terms
// added in the same order, so the tiled nest gives the bits of the loops it replaces: what
// changes is only how many sums are in flight at once, which is what lets the C compiler use
// vector instructions without reordering any one sum (it may not, without -ffast-math).
// A sum too long for its panel of packed columns to stay in the cache (a convolution's weight
// gradient: a sum over batch and image) runs in pieces, its partial sums kept in memory
// between them (tree_pieces): in order, so in the same bits. Elementwise nests after a product
// join it as its epilogue (fuse_epilogue, in fuse_loops).
struct ProductMatch {
    std::vector<int> loops;                     // output loop variables, outermost first
    int rows = -1, cols = -1;                   // the axes x and y run along
    // the innermost output loop's body: its sum trees, and the stores and the locals they
    // read, which run after all the trees (each in its order)
    std::vector<Stmt> trees, epilogue;
    int64_t terms = 0;                          // terms in each element's sum
    bool column_products = false;   // without rows, terms x·y with x and y read along columns
};
static const int64_t TILE_LANES = 16;        // floats in a vector: 64 bytes, AVX-512's width
                                             // (compilers split it where vectors are narrower)
static const int TILE_MIN_WORK = 1 << 15;   // multiply-adds; fewer stay loops (TG_TILE_MIN_WORK)
static const int64_t PANEL_BYTES = int64_t(1) << 18;     // packed columns: about half an L2
static const int64_t CARRY_BYTES = int64_t(1) << 18;     // a row block's sums between pieces
// multiply-adds below which a tiled nest runs on the calling thread: about 30 µs of a core,
// against the microseconds of handing chunks to the pool (W2's products: 1.3M at most; on
// threads its step took 500 µs, on one 330-380)
static const int64_t TILE_PARALLEL_MIN_WORK = int64_t(1) << 21;

static bool expr_has(const ExprP& e, EK kind) {
    bool found = false;
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) { found = found || part->kind == kind; });
    return found;
}
static bool uses_buffer(const ExprP& e, int buffer) {
    bool found = false;
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        found = found || (part->kind == EK::LOAD && part->id == buffer);
    });
    return found;
}
static bool uses_var(const ExprP& e, int var) {
    std::unordered_set<int> vars;
    vars_used(e, vars);
    return vars.count(var) > 0;
}
// Whether var appears in an index only as step·var (step 0: not at all), and its step.
static bool step_along(const ExprP& idx, int var, int64_t& step) {
    Linear lin;
    lin.add(1, idx);
    step = 0;
    for (auto& [coef, term] : lin.terms) {
        bool is_var = term->kind == EK::VAR && term->id == var;
        if (!is_var && uses_var(term, var)) return false;
        if (is_var) step = coef;
    }
    return true;
}
// Whether an index moves by exactly one element when var does, wherever var is.
static bool steps_by_one(const ExprP& idx, int var) {
    int64_t step;
    return step_along(idx, var, step) && step == 1;
}
// Whether some load in e moves by one element when var does (e is read along var).
static bool read_along(const ExprP& e, int var) {
    bool found = false;
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        if (part->kind != EK::LOAD) return;
        Linear lin;
        lin.add(1, part->src[0]);
        for (auto& [coef, term] : lin.terms)
            found = found || (coef == 1 && term->kind == EK::VAR && term->id == var);
    });
    return found;
}

TG_COLD_BEGIN   // the passes; the analyses and IR walks above stay optimized
// A term as x·y given the axes of the rows and the columns (rows -1: none): x, the operand
// that does not read the columns, is src[x_at] of the product; y does not read the rows. A
// term that is no such product and does not read the rows is y alone (x null): a sum of
// columns. False where it is neither.
static bool split_term(const ExprP& term, int rows, int cols, ExprP& x, ExprP& y, int& x_at) {
    if (term->kind == EK::ALU && term->op == Op::MUL && rows >= 0)
        for (x_at = 0; x_at < 2; x_at++) {
            x = term->src[size_t(x_at)];
            y = term->src[size_t(1 - x_at)];
            if (!uses_var(x, cols) && !uses_var(y, rows)) return true;
        }
    x = nullptr;
    y = term;
    // a product packed as one value would be rounded before its addition, which the loops
    // fuse (fused_term): it is no sum of columns. Without rows, a product of two loads that
    // step along the columns multiplies vectors of both where they lie (x·y, x not null), each
    // lane's multiply-add fused as the loop's (a layer norm's weight gradient).
    if (term->kind == EK::ALU && term->op == Op::MUL && dtype_is_float(term->dtype)) {
        auto along = [&](const ExprP& e) {
            return e->kind == EK::LOAD && steps_by_one(e->src[0], cols);
        };
        if (rows >= 0 || !along(term->src[0]) || !along(term->src[1])) return false;
        x = term->src[0];
        y = term->src[1];
        x_at = 0;
        return true;
    }
    return rows < 0 || !uses_var(term, rows);
}
// A term of a sum tree: acc += v, or acc = v where first_write started the sum with it.
static bool is_term(const Stmt& st) {
    return st.kind == SK::ACC_UPDATE ? st.val->kind != EK::ACC : st.val->kind != EK::CONST;
}
// body is a forest of sum trees: loops, float accumulators set to +0, acc += acc and terms
// (returned in terms; with bounds checks only where checks; reading no accumulator but
// `values`, set before the trees); count is how many terms one pass over body adds
static bool sum_trees(const std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                      std::vector<ExprP>& terms, int64_t& count, bool checks = false,
                      const std::unordered_set<int>& values = {}) {
    for (const Stmt& st : body) {
        if (st.kind == SK::LOOP) {
            int64_t inner = 0;
            if (!sum_trees(st.body, extents, terms, inner, checks, values)) return false;
            count += inner * extents[size_t(st.id)];
            continue;
        }
        if (st.op != Op::REDUCE_SUM || st.dtype != DType::FLOAT32 ||
            (st.kind != SK::ACC_INIT && st.kind != SK::ACC_UPDATE))
            return false;
        const ExprP& v = st.val;
        if (is_term(st)) {
            bool reads_accs = false;
            ExprSet seen;
            each_part(v, seen, [&](const ExprP& part) {
                reads_accs = reads_accs || (part->kind == EK::ACC && !values.count(part->id));
            });
            if (v->dtype != DType::FLOAT32 || reads_accs ||
                (!checks && expr_has(v, EK::CHECK)))
                return false;
            terms.push_back(v);
            count++;
        } else if (st.kind == SK::ACC_INIT ? !is_const(v, 0) || std::signbit(v->num)
                                            : v->kind != EK::ACC) {
            return false;
        }
    }
    return true;
}
// A loop body as sum trees and the epilogue after them (see ProductMatch): the trees are sums
// of float32 terms (terms: each pass's count; bounds-checked where checks), and the epilogue
// stores each buffer once, reading it only where it stores it; the terms read no buffer the
// epilogue stores.
static bool trees_and_epilogue(const std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                               std::vector<Stmt>& trees, std::vector<Stmt>& epilogue,
                               std::vector<ExprP>& terms, int64_t& count, bool checks = false) {
    // An epilogue statement moves after the trees that follow it: no accumulator it reads is
    // set after it (the terms read no accumulator and no buffer it writes, checked below).
    // Locals (an accumulator set once from loads, as substitute_temps leaves an optimizer's
    // moments) are epilogue statements too.
    std::unordered_set<int> read_before;   // by the epilogue statements so far
    std::unordered_set<int> in_trees;
    accs_in_trees(body, in_trees);
    for (const Stmt& st : body) {
        bool store = st.kind == SK::STORE || st.kind == SK::STORE_ADD;
        std::unordered_set<int> reads, sets;
        accs_read(st, reads);
        bool local =
            st.kind == SK::ACC_INIT && st.val->kind != EK::CONST && !in_trees.count(st.id);
        if (store || (st.kind == SK::ACC_INIT && !reads.empty()) || local) {
            epilogue.push_back(st);
            read_before.insert(reads.begin(), reads.end());
            continue;
        }
        accs_set(st, sets);
        for (int acc : sets)
            if (read_before.count(acc)) return false;
        trees.push_back(st);
    }
    if (!sum_trees(trees, extents, terms, count, checks) || terms.empty()) return false;
    std::map<int, ExprP> stored;   // buffer → the index its store writes
    for (const Stmt& st : epilogue) {
        bool store = st.kind == SK::STORE || st.kind == SK::STORE_ADD;
        if (expr_has(st.val, EK::CHECK) ||
            (store && (expr_has(st.idx, EK::CHECK) || stored.count(st.id))))
            return false;
        if (store) stored[st.id] = st.idx;
    }
    if (stored.empty()) return false;
    // the terms read no buffer the nest writes; the epilogue reads one only where it writes it
    for (const ExprP& t : terms)
        for (auto& [buffer, idx] : stored)
            if (uses_buffer(t, buffer)) return false;
    for (const Stmt& st : epilogue) {
        bool apart = false;
        ExprSet seen;
        each_part(st.val, seen, [&](const ExprP& part) {
            auto w = part->kind == EK::LOAD ? stored.find(part->id) : stored.end();
            apart = apart || (w != stored.end() && !expr_eq(w->second, part->src[0]));
        });
        if (apart) return false;
    }
    return true;
}
static bool match_product(const Block& b, ProductMatch& m) {
    m = ProductMatch{};
    const std::vector<Stmt>* body = &b.body;
    while (body->size() == 1 && (*body)[0].kind == SK::LOOP) {
        m.loops.push_back((*body)[0].id);
        body = &(*body)[0].body;
    }
    std::vector<ExprP> terms;
    if (m.loops.empty() ||
        !trees_and_epilogue(*body, b.extents, m.trees, m.epilogue, terms, m.terms))
        return false;
    // the rows and columns: innermost loops first (choosing the pair that packs the fewest
    // values made W2 20-35% faster and W5 8-30% slower in two A/B runs: W5's products then
    // took the tokens as columns, so their GELU epilogues stored across the columns);
    // without rows, only sums of columns that are read along them (elsewhere packing them
    // would cost what tiling saves)
    // columns narrower than half a vector (a weight gradient's 3 input channels) come last
    ExprP x, y;
    int x_at = 0;
    for (int narrow = 0; narrow < 2; narrow++)
        for (auto c = m.loops.rbegin(); c != m.loops.rend(); ++c) {
            if ((b.extents[size_t(*c)] < TILE_LANES / 2) != bool(narrow)) continue;
            for (auto r = m.loops.rbegin(); r != m.loops.rend(); ++r) {
                bool fits = *r != *c, products = false;
                for (const ExprP& t : terms) {
                    fits = fits && split_term(t, *r, *c, x, y, x_at);
                    products = products || x;
                }
                if (!fits || !products) continue;
                m.rows = *r;
                m.cols = *c;
                return true;
            }
        }
    for (auto c = m.loops.rbegin(); c != m.loops.rend(); ++c) {
        bool along = true, products = false;
        for (const ExprP& t : terms) {
            along = along && read_along(t, *c) && split_term(t, -1, *c, x, y, x_at);
            products = products || x;
        }
        if (!along) continue;
        m.cols = *c;
        m.column_products = products;
        return true;
    }
    return false;
}
// The sum trees in pieces of at most `limit` terms, in their order: runs of statements, or
// iterations of a loop `chunk` at a time, or a loop too long for that run iteration by
// iteration around pieces of its body. Between pieces a tile's sums set at those levels
// (`carried`) wait in memory, which keeps every sum's order and so its bits. False where a
// statement that is no loop has too many terms, or the epilogue reads a sum not carried.
struct TreePiece {
    std::vector<Stmt> stmts;          // a run of statements, or one loop chunked or around
    int64_t chunk = 0;                // > 0: the loop, this many iterations at a time
    std::vector<TreePiece> inner;     // not empty: the loop, around these pieces of its body
    int64_t terms = 0;                // packed at a time (a chunk's: a whole chunk's)
};
static bool cut_trees(const std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                      int64_t limit, std::vector<TreePiece>& pieces, std::vector<int>& carried) {
    for (const Stmt& st : body)
        if (st.kind == SK::ACC_INIT) carried.push_back(st.id);
    TreePiece run;
    for (const Stmt& st : body) {
        std::vector<ExprP> terms;
        int64_t count = 0;
        sum_trees({st}, extents, terms, count);
        if (run.terms + count <= limit) {
            run.stmts.push_back(st);
            run.terms += count;
            continue;
        }
        if (!run.stmts.empty()) pieces.push_back(std::move(run));
        run = TreePiece{{st}, 0, {}, count};
        if (count <= limit) continue;
        if (st.kind != SK::LOOP) return false;
        int64_t each = count / extents[size_t(st.id)];
        if (each <= limit) {
            run.chunk = limit / each;
            run.terms = run.chunk * each;
        } else {
            if (!cut_trees(st.body, extents, limit, run.inner, carried)) return false;
            run.terms = 0;
            for (const TreePiece& piece : run.inner) run.terms = std::max(run.terms, piece.terms);
        }
        pieces.push_back(std::move(run));
        run = TreePiece{};
    }
    if (!run.stmts.empty()) pieces.push_back(std::move(run));
    return true;
}
static bool tree_pieces(const ProductMatch& m, const std::vector<int64_t>& extents,
                        int64_t limit, std::vector<TreePiece>& pieces,
                        std::vector<int>& carried) {
    pieces.clear();
    carried.clear();
    if (!cut_trees(m.trees, extents, limit, pieces, carried)) return false;
    std::unordered_set<int> read, set;
    accs_read(m.epilogue, read);
    accs_set(m.trees, set);
    for (int acc : read)
        if (set.count(acc) && std::find(carried.begin(), carried.end(), acc) == carried.end())
            return false;
    return !carried.empty();
}
// Tile sizes: 4 vectors of columns by 4 rows, 2 by 8 or 1 by 8, so that the innermost sums fill
// about half the 32 vector registers (the level above them takes the rest, then spills); 2 by 8
// where it computes fewer padding columns and rows than 4 by 4 (W2's 200 columns are 256 in
// tiles of 64 columns, 224 in tiles of 32: one-thread W2's median step 113-118 -> 105-108 us,
// and with its 27 columns by 32 rows in tiles of 8 rows, not 6, 97-98 us). Tasks, what threads
// share: panels of columns (at most PANEL_BYTES packed), narrowed to give PARALLEL_CHUNKS
// tasks where they can (one task for a nest that runs on the calling thread), then blocks of
// at least MIN_ROW_BLOCK rows (fewer where a sum in pieces keeps more than CARRY_BYTES of
// partial sums); each task packs its own operands, so the packing is a small part of its work.
static const int64_t MIN_ROW_BLOCK = 64;
static bool plan_tiles(const Block& b, const ProductMatch& m, Block::Tiles& t) {
    int64_t rows = m.rows >= 0 ? b.extents[size_t(m.rows)] : 1;
    int64_t cols = b.extents[size_t(m.cols)], outer = 1;
    for (int v : m.loops)
        if (v != m.rows && v != m.cols) outer *= b.extents[size_t(v)];
    if (outer * rows * cols * m.terms < env_int("TG_TILE_MIN_WORK", TILE_MIN_WORK, 0, INT32_MAX))
        return false;
    int64_t vectors = cols > 2 * TILE_LANES ? 4 : cols > TILE_LANES ? 2 : 1;
    if (m.column_products) {   // read where they lie, never packed: whole vectors of columns
        while (vectors > 0 && cols % (vectors * TILE_LANES)) vectors /= 2;
        if (vectors == 0) return false;
    } else {
        while (vectors > 1 && m.terms * vectors * TILE_LANES * 4 > PANEL_BYTES) vectors /= 2;
    }
    // a sum too long for a panel: in pieces, each row block's sums waiting in CARRY_BYTES
    int64_t panel_terms = m.terms;
    std::vector<TreePiece> pieces;
    std::vector<int> carried;   // their count bounds the row block
    if (!m.column_products && m.terms * vectors * TILE_LANES * 4 > PANEL_BYTES) {
        t.piece_terms = PANEL_BYTES / (vectors * TILE_LANES * 4);
        if (!tree_pieces(m, b.extents, t.piece_terms, pieces, carried)) return false;
        panel_terms = t.piece_terms;
    }
    auto padded = [&](int64_t v, int64_t r) {   // the columns and rows that tiles compute
        int64_t w = v * TILE_LANES;
        return (cols + w - 1) / w * w * ((rows + r - 1) / r * r);
    };
    if (vectors == 4 && padded(2, 8) < padded(4, 4)) vectors = 2;
    t.cols = int(vectors * TILE_LANES);
    t.rows = int(std::min<int64_t>(rows, vectors == 4 ? 4 : 8));
    bool threads = outer * rows * cols * m.terms >= parallel_min_work(TILE_PARALLEL_MIN_WORK);
    int64_t wanted = threads ? PARALLEL_CHUNKS : 1;
    int64_t col_tiles = (cols + t.cols - 1) / t.cols;
    int64_t panels = std::max((col_tiles * t.cols * panel_terms * 4 + PANEL_BYTES - 1) /
                                  PANEL_BYTES, std::min(col_tiles, (wanted + outer - 1) / outer));
    t.panel_cols = (col_tiles + panels - 1) / panels * t.cols;
    panels = (cols + t.panel_cols - 1) / t.panel_cols;
    int64_t blocks = std::min((rows + MIN_ROW_BLOCK - 1) / MIN_ROW_BLOCK,
                              (wanted + outer * panels - 1) / (outer * panels));
    if (t.piece_terms) {
        int64_t carry_rows = CARRY_BYTES / (4 * t.panel_cols * int64_t(carried.size()));
        if (carry_rows < t.rows) return false;
        blocks = std::max(blocks, (rows + carry_rows - 1) / (carry_rows / t.rows * t.rows));
    }
    t.row_block = blocks == 1 ? rows
                              : ((rows + blocks - 1) / blocks + t.rows - 1) / t.rows * t.rows;
    t.tasks = outer * panels * ((rows + t.row_block - 1) / t.row_block);
    return true;
}
// each / and % in body's statements, once each
static void each_division(const std::vector<Stmt>& body,
                          const std::function<void(const Expr&)>& f) {
    ExprSet seen;
    std::function<void(const std::vector<Stmt>&)> walk = [&](const std::vector<Stmt>& stmts) {
        for (const Stmt& st : stmts) {
            for (const ExprP& e : {st.idx, st.val})
                each_part(e, seen, [&](const ExprP& part) {
                    if (part->kind == EK::ALU && (part->op == Op::DIV || part->op == Op::MOD))
                        f(*part);
                });
            walk(st.body);
        }
    };
    walk(body);
}
// Two nested output loops, `depth` loops down, whose variables index everything only as one
// (v0·E1 + v1) become one loop of E0·E1 iterations. The batch and time axes of a [B,T,C]
// activation: a product over B batches of T rows is then one product over B·T rows, which
// packs its other operand once, not once per batch. An image's rows and columns (a
// convolution's input gradient, [N, C, H, W]): its columns are then its H·W pixels, in tiles
// of 64, not its W.
static bool merge_loops(Block& b, size_t depth) {
    Block merged = b;
    std::vector<Stmt>* body = &merged.body;
    for (size_t d = 0; d < depth; d++) {
        if (body->size() != 1 || (*body)[0].kind != SK::LOOP) return false;
        body = &(*body)[0].body;
    }
    if (body->size() != 1 || (*body)[0].kind != SK::LOOP || (*body)[0].body.size() != 1 ||
        (*body)[0].body[0].kind != SK::LOOP)
        return false;
    Stmt& loop = (*body)[0];
    int v0 = loop.id, v1 = loop.body[0].id, j = int(merged.extents.size());
    int64_t e1 = merged.extents[size_t(v1)];
    merged.extents.push_back(merged.extents[size_t(v0)] * e1);
    std::vector<Stmt> inner = std::move(loop.body[0].body);
    loop.body = std::move(inner);
    loop.id = j;
    substitute_var(loop.body, v0, ex_alu(Op::DIV, DType::INDEX, {ex_var(j), ix(e1)}));
    substitute_var(loop.body, v1, ex_alu(Op::MOD, DType::INDEX, {ex_var(j), ix(e1)}));
    SimplifyMemo memo{&merged.extents, {}};
    simplify_stmts(loop.body, memo);
    bool split = false;   // somewhere the two variables are still apart
    each_division(loop.body, [&](const Expr& division) {
        split = split || uses_var(division.src[0], j) || uses_var(division.src[1], j);
    });
    if (split) return false;
    b = std::move(merged);
    return true;
}
static size_t nested_loops(const Block& b) {   // the loops that each hold only the next
    size_t n = 0;
    for (const std::vector<Stmt>* body = &b.body;
         body->size() == 1 && (*body)[0].kind == SK::LOOP; body = &(*body)[0].body)
        n++;
    return n;
}
static void pass_tile_products(Program& p) {
    for (size_t k = 0; k < p.blocks.size(); k++) {
        Block& b = p.blocks[k];
        bool locals = false;   // arrays of the nest's loops (local_temps) are not packed
        for (const ProgramBuffer& pb : p.buffers) locals = locals || pb.local_block == int(k);
        ProductMatch m;
        b.tile = {};
        // the innermost pair first (the columns), then the outermost (the rows)
        for (bool innermost : {true, false})
            for (Block merged = b; !locals && nested_loops(b) >= 2 &&
                                   merge_loops(merged, innermost ? nested_loops(b) - 2 : 0);) {
                Block::Tiles t;
                if (!match_product(merged, m) || !plan_tiles(merged, m, t)) break;
                b = merged;
            }
        if (locals || !match_product(b, m) || !plan_tiles(b, m, b.tile)) {
            b.tile = {};
            continue;
        }
        int64_t work = m.terms;
        for (int v : m.loops) work *= b.extents[size_t(v)];
        b.parallel_chunks = work >= parallel_min_work(TILE_PARALLEL_MIN_WORK) && b.tile.tasks > 1
                                ? std::min(b.tile.tasks, PARALLEL_CHUNKS) : 0;
    }
}

// -- pass_fuse_loops: adjacent nests over the same extent become one nest
// Two loops fuse when they have the same extent and every buffer that one writes and the other
// touches is accessed in chunks of the loop variable: index = v·S + base + r, with the same S
// and the same loop-invariant base everywhere, and 0 <= r < S for r the terms of the variables
// inside the loop and the constant. Iteration v of the second loop then touches only what
// iteration v of the first touched, so the fused loop keeps every dependence in order. Blocks
// that are one loop each fuse this way, then the loops inside the fused body do, so a value
// stored and read back at the same index ends in one loop body (pass_substitute_temps). A nest
// between two that could fuse is stepped over (seed 004): the right one merges left when it is
// independent of the nests in between, else the left one merges right when it is. Nests that
// store only outside loops (a loss, a step count) join one another, and once the loops have
// fused, such a nest joins a loop beside it that is too small for threads: its statements run
// after (or before) the loop.
static void vars_bound(const std::vector<Stmt>& body, std::unordered_set<int>& vars) {
    for (const Stmt& st : body)
        if (st.kind == SK::LOOP) {
            vars.insert(st.id);
            vars_bound(st.body, vars);
        }
}
struct Chunk {
    int64_t stride = 0;
    ExprP base;
};
static bool chunked(const ExprP& idx, const Stmt& loop, const std::vector<int64_t>& extents,
                    Chunk& chunk) {
    std::unordered_set<int> inner;
    vars_bound(loop.body, inner);
    Linear lin, base, rest;
    lin.add(1, idx);
    int64_t coef = 0;
    for (auto& [c, term] : lin.terms) {
        std::unordered_set<int> vars;
        vars_used(term, vars);
        bool varies = false;
        for (int v : vars) varies = varies || inner.count(v);
        if (term->kind == EK::VAR && term->id == loop.id) coef += c;
        else if (vars.count(loop.id)) return false;
        else if (varies) rest.terms.push_back({c, term});
        else base.terms.push_back({c, term});
    }
    rest.constant = lin.constant;   // x[v·S + S-1 - r] is in chunk v as much as x[v·S + r]
    Range r = range_of(rest.build(), extents);
    if (coef <= 0 || !r.known || r.lo < 0 || r.hi >= coef) return false;
    ExprP b = base.build();
    if (chunk.base && (chunk.stride != coef || !expr_eq(chunk.base, b))) return false;
    chunk = {coef, b};
    return true;
}
// A loop body that both runs a reduction loop and computes an op that vectorizes poorly is
// one GCC 12 vectorizes worse than the two apart (measured on W2: a matrix product fused with
// its tanh epilogue in one loop ran 1.3-1.7x slower), until kernels are tiled and vectorized by
// us rather than by the C compiler. Such loops fuse only at the levels above: the product's
// and the epilogue's inner loops stay two loops in the fused outer one.
static bool vectorizes_poorly_in(const ExprP& e) {
    bool found = false;
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        found = found || (part->kind == EK::ALU && vectorizes_poorly(part->op));
    });
    return found;
}
static bool accumulates(const std::vector<Stmt>& body) {   // is or holds a reduction loop
    for (const Stmt& st : body)
        if (st.kind == SK::ACC_UPDATE || (st.kind == SK::LOOP && accumulates(st.body)))
            return true;
    return false;
}
static bool vectorizes_poorly_directly(const Stmt& loop) {   // not counting inner loops
    for (const Stmt& st : loop.body)
        if (st.kind != SK::LOOP && (vectorizes_poorly_in(st.idx) || vectorizes_poorly_in(st.val)))
            return true;
    return false;
}

// same_block: the loops share accumulators (two blocks' are renumbered when they fuse)
static bool loops_fusable(const Stmt& la, const std::vector<int64_t>& ea, const Stmt& lb,
                          const std::vector<int64_t>& eb, bool same_block) {
    if (la.kind != SK::LOOP || lb.kind != SK::LOOP || ea[size_t(la.id)] != eb[size_t(lb.id)])
        return false;
    if ((vectorizes_poorly_directly(la) || vectorizes_poorly_directly(lb)) &&
        (accumulates(la.body) || accumulates(lb.body)))
        return false;
    if (same_block) {   // an accumulator one loop sets and the other reads links iterations
        std::unordered_set<int> set_a, set_b, read_a, read_b;
        accs_set(la.body, set_a);
        accs_set(lb.body, set_b);
        accs_read(la.body, read_a);
        accs_read(lb.body, read_b);
        for (int acc : set_a)
            if (set_b.count(acc) || read_b.count(acc)) return false;
        for (int acc : set_b)
            if (read_a.count(acc)) return false;
    }
    BlockAccesses ua, ub;
    std::vector<int> loops;
    collect_accesses(la.body, loops, ua);
    collect_accesses(lb.body, loops, ub);
    auto conflicts = [&](int buffer) {
        return (ua.writes(buffer) && (ub.reads(buffer) || ub.writes(buffer))) ||
               (ub.writes(buffer) && ua.reads(buffer));
    };
    std::map<int, Chunk> chunks;   // buffer → how both loops must access it
    for (const Access& acc : ua.accesses)
        if (conflicts(acc.buffer) && !chunked(acc.idx, la, ea, chunks[acc.buffer])) return false;
    for (const Access& acc : ub.accesses)
        if (conflicts(acc.buffer) && !chunked(acc.idx, lb, eb, chunks[acc.buffer])) return false;
    return true;
}
// Adjacent loops of one body that can fuse do, at every depth.
static void fuse_inner_loops(std::vector<Stmt>& body, const std::vector<int64_t>& extents) {
    for (size_t p = 0; p + 1 < body.size();) {
        if (!loops_fusable(body[p], extents, body[p + 1], extents, true)) { p++; continue; }
        Stmt second = std::move(body[p + 1]);
        body.erase(body.begin() + std::ptrdiff_t(p) + 1);
        substitute_var(second.body, second.id, ex_var(body[p].id));
        for (Stmt& st : second.body) body[p].body.push_back(std::move(st));
    }
    for (Stmt& st : body)
        if (st.kind == SK::LOOP) fuse_inner_loops(st.body, extents);
}
static const size_t FUSED_MAX_STMTS = 64;   // a bound on a fused loop's body: the analyses
                                            // above are linear in it, and so is the C
static bool tiled_later(const Block& b) {   // pass_tile_products will take it
    ProductMatch m;
    Block::Tiles t;
    return match_product(b, m) && plan_tiles(b, m, t);
}
static void fuse_into(Block& a, Block& b, bool one_after_other);
static int64_t loop_work(const std::vector<Stmt>& body, const std::vector<int64_t>& extents);
// A nest that stores only outside loops (a loss, an optimizer's step count and its bias
// corrections): two such nests are one when their statements run one after the other.
static bool stores_in_loops(const std::vector<Stmt>& body, bool in_loop) {
    for (const Stmt& st : body)
        if ((in_loop && (st.kind == SK::STORE || st.kind == SK::STORE_ADD)) ||
            (st.kind == SK::LOOP && stores_in_loops(st.body, true)))
            return true;
    return false;
}
static bool scalar_block(const Block& b) { return !stores_in_loops(b.body, false); }
// Two nests whose statements may simply run one after the other in one nest: both scalar, or
// (with loops_too) one scalar and the other a loop too small for threads that is no product,
// so a step count joins the update before it instead of being a nest of its own.
// (a_tiled, b_tiled: tiled_later of each, which the caller knows)
static bool joins_one_after_other(const Block& a, const Block& b, bool loops_too, bool a_tiled,
                                  bool b_tiled) {
    bool scalar_a = scalar_block(a), scalar_b = scalar_block(b);
    if (scalar_a && scalar_b) return true;
    if (!loops_too || scalar_a == scalar_b) return false;
    const Block& loop = scalar_a ? b : a;
    return loop.body.size() == 1 && loop.body[0].kind == SK::LOOP &&
           !(scalar_a ? b_tiled : a_tiled) &&
           loop_work(loop.body, loop.extents) < PARALLEL_MIN_WORK;
}
// Values of a nest that lowering computes once before its loop (loop-invariant: Adam's bias
// corrections) go into the loop, so the nest is one loop that can fuse: each iteration
// computes them again, a load and an op or two. False, with b unchanged, where they read what
// the loop writes.
static bool sink_invariants(Block& b) {
    if (b.body.size() < 2 || b.body.back().kind != SK::LOOP) return false;
    std::vector<Stmt> loop(1, b.body.back());
    BlockAccesses in_loop;
    std::vector<int> loops;
    collect_accesses(loop, loops, in_loop);
    std::unordered_set<int> set_in_loop;
    accs_set(loop, set_in_loop);
    std::map<int, ExprP> value;   // accumulator → the value it holds
    Rewritten done;
    auto by_value = [&](const ExprP& e) -> ExprP {
        auto v = e->kind == EK::ACC ? value.find(e->id) : value.end();
        return v != value.end() ? v->second : nullptr;
    };
    for (size_t s = 0; s + 1 < b.body.size(); s++) {
        const Stmt& st = b.body[s];
        if (st.kind != SK::ACC_INIT || set_in_loop.count(st.id) || value.count(st.id))
            return false;
        for (const Access& a : in_loop.accesses)
            if (a.write && uses_buffer(st.val, a.buffer)) return false;
        value[st.id] = substitute(st.val, by_value, done);
    }
    substitute(loop, by_value, done);
    b.body = std::move(loop);
    return true;
}
// (checks: either holds a bounds check)
static bool blocks_fusable(const Block& a, const Block& b, bool tiling, bool one_after_other,
                           bool a_tiled, bool b_tiled, bool checks) {
    if (one_after_other ? a.body.size() + b.body.size() > FUSED_MAX_STMTS
                        : a.body.size() != 1 || b.body.size() != 1 ||
                              a.body[0].kind != SK::LOOP ||
                              a.body[0].body.size() + b.body[0].body.size() > FUSED_MAX_STMTS)
        return false;
    if (a.finite_site >= 0 || b.finite_site >= 0) return false;
    // a failed bounds check stops the program before in-place writes: keep them apart
    if (checks && (a.writes_in_place || b.writes_in_place)) return false;
    if (one_after_other) return true;
    if (!loops_fusable(a.body[0], a.extents, b.body[0], b.extents, false)) return false;
    // a nest to be tiled fuses only into one that still is (sums of columns side by side)
    if (!tiling || (!a_tiled && !b_tiled)) return true;
    Block fused = a, other = b;
    fuse_into(fused, other, false);
    return tiled_later(fused);
}
static bool blocks_independent(const Block& a, const BlockAccesses& ua, const Block& b,
                               const BlockAccesses& ub) {
    if (a.finite_site >= 0 || b.finite_site >= 0) return false;
    // a failed bounds check stops the program before the in-place writes after it; other
    // writes go to buffers that a failed program throws away
    if ((ua.checks && b.writes_in_place) || (ub.checks && a.writes_in_place)) return false;
    for (const Access& acc : ua.accesses)
        if (ub.writes(acc.buffer) || (acc.write && ub.reads(acc.buffer))) return false;
    return true;
}
static void take_title(Block& a, const Block& b) {   // a now also does what b did
    a.title += " + " + b.title;
    if (!b.origin.empty() && a.origin.find(b.origin) == std::string::npos)
        a.origin += (a.origin.empty() ? "" : ", ") + b.origin;
    a.writes_in_place = a.writes_in_place || b.writes_in_place;
}
static void fuse_into(Block& a, Block& b, bool one_after_other) {   // else outer loops fuse
    int outer = one_after_other ? -1 : a.body[0].id, b_outer = one_after_other ? -1 : b.body[0].id;
    std::vector<int> var_of(b.extents.size());
    for (size_t v = 0; v < b.extents.size(); v++) {
        if (int(v) == b_outer) { var_of[v] = outer; continue; }
        var_of[v] = int(a.extents.size());
        a.extents.push_back(b.extents[v]);
    }
    std::vector<Stmt>& into = one_after_other ? a.body : a.body[0].body;
    std::vector<Stmt> moved = std::move(one_after_other ? b.body : b.body[0].body);
    renumber_after(moved, var_of, a);
    for (Stmt& st : moved) into.push_back(std::move(st));
    if (!one_after_other) fuse_inner_loops(into, a.extents);
    take_title(a, b);
}
// A product's epilogue: nest b, loops like a's output loops around stores and locals only
// (an elementwise op of the product's result: bias, activation, a gradient's chain, an
// optimizer's update), joins a's stores, so it runs on each element of a tile as it is done.
// False, with a unchanged, where b is not such a nest.
static bool fuse_epilogue(Block& a, const Block& b) {
    std::vector<Stmt*> la;
    std::vector<const Stmt*> lb;
    std::vector<Stmt>* ia = &a.body;
    const std::vector<Stmt>* ib = &b.body;
    for (; ia->size() == 1 && (*ia)[0].kind == SK::LOOP; ia = &(*ia)[0].body)
        la.push_back(&(*ia)[0]);
    for (; ib->size() == 1 && (*ib)[0].kind == SK::LOOP; ib = &(*ib)[0].body)
        lb.push_back(&(*ib)[0]);
    if (la.size() != lb.size() || b.finite_site >= 0 || a.finite_site >= 0) return false;
    for (size_t d = 0; d < la.size(); d++)
        if (a.extents[size_t(la[d]->id)] != b.extents[size_t(lb[d]->id)]) return false;
    for (const Stmt& st : *ib)
        if (st.kind != SK::STORE && st.kind != SK::STORE_ADD && st.kind != SK::ACC_INIT)
            return false;
    std::vector<int> var_of(b.extents.size(), -1);
    for (size_t d = 0; d < lb.size(); d++) var_of[size_t(lb[d]->id)] = la[d]->id;
    for (size_t v = 0; v < var_of.size(); v++)
        if (var_of[v] < 0) {
            var_of[v] = int(a.extents.size());
            a.extents.push_back(b.extents[v]);
        }
    std::vector<Stmt> moved = *ib;
    renumber_after(moved, var_of, a);
    for (Stmt& st : moved) ia->push_back(std::move(st));
    take_title(a, b);
    return true;
}
static bool epilogue_fusable(const Block& a, const Block& b, bool checks) {
    if (checks && (a.writes_in_place || b.writes_in_place)) return false;
    Block trial = a;
    return fuse_epilogue(trial, b) && tiled_later(trial);
}
static const size_t FUSE_WINDOW = 8;   // how many nests ahead a nest looks for a partner
// Whether a and b are maps (one nest of loops around stores and checks alone, without
// TG_CHECK's scan) over loops of the same extents, level by level.
static bool same_maps(const Block& a, const Block& b) {
    auto loops = [](const Block& x, std::vector<int64_t>& extents) {
        const std::vector<Stmt>* body = &x.body;
        for (; body->size() == 1 && (*body)[0].kind == SK::LOOP; body = &(*body)[0].body)
            extents.push_back(x.extents[size_t((*body)[0].id)]);
        for (const Stmt& st : *body)
            if (st.kind != SK::STORE && st.kind != SK::STORE_ADD && st.kind != SK::CHECK)
                return false;
        return !extents.empty() && x.finite_site < 0;
    };
    std::vector<int64_t> ea, eb;
    return loops(a, ea) && loops(b, eb) && ea == eb;
}
static std::vector<std::string> passes_selected();
// The sweeps of pass_fuse_loops over one program. What they ask of a nest (tiled_later, its
// accesses, its invariants sunk) and of a pair (fusable, as an epilogue or not) is costly and
// asked again and again: it is kept by the nests' versions (a fused nest gets a new one), so
// the second sweep asks only about the nests that the first one changed.
struct FuseSweeps {
    struct Facts {
        explicit Facts(uint64_t v) : version(v) {}
        uint64_t version;
        int8_t tiled = -1, sinks = -1, sunk_tiled = -1;   // -1: not asked yet
        std::optional<BlockAccesses> uses;
        Block sunk;   // with its invariants in its loop, where sinks
    };
    struct Pair { bool epilogue, fusable; };
    std::vector<Block>& bs;
    bool tiling;
    // pass_fuse_maps: only maps into maps over the same loops, or into a product's epilogue
    bool maps_only = false;
    std::vector<Facts> facts;
    uint64_t versions = 0;
    std::map<std::tuple<uint64_t, uint64_t, bool>, Pair> pairs;   // by versions, one_after_other

    FuseSweeps(std::vector<Block>& blocks, bool tiles) : bs(blocks), tiling(tiles) {
        for (size_t k = 0; k < bs.size(); k++) facts.emplace_back(versions++);
    }
    bool tiled(size_t k) {
        if (facts[k].tiled < 0) facts[k].tiled = tiled_later(bs[k]);
        return facts[k].tiled == 1;
    }
    const BlockAccesses& uses(size_t k) {
        if (!facts[k].uses) facts[k].uses = block_accesses(bs[k]);
        return *facts[k].uses;
    }
    bool sinks(size_t k) {
        Facts& f = facts[k];
        if (f.sinks < 0) {
            f.sinks = 0;
            if (bs[k].body.size() > 1) {
                f.sunk = bs[k];
                f.sinks = sink_invariants(f.sunk);
                if (f.sinks) f.sunk_tiled = tiled_later(f.sunk);
            }
        }
        return f.sinks == 1;
    }
    void changed(size_t k) { facts[k] = Facts(versions++); }
    void erase(size_t k) {
        bs.erase(bs.begin() + std::ptrdiff_t(k));
        facts.erase(facts.begin() + std::ptrdiff_t(k));
    }

    // loops_too: the second sweep, which joins a nest of one value to a small loop beside it
    void sweep(bool loops_too) {
        for (size_t i = 0; i < bs.size(); i++) {
            for (size_t j = i + 1; j < bs.size() && j <= i + FUSE_WINDOW; j++) {
                bool i_tiled = tiled(i);
                bool into_product = maps_only && i_tiled && same_maps(bs[j], bs[j]);
                if (maps_only && !into_product && !same_maps(bs[i], bs[j])) continue;
                bool sunk = !maps_only && sinks(j);
                const Block& bj = sunk ? facts[j].sunk : bs[j];
                bool j_tiled = sunk ? facts[j].sunk_tiled == 1 : tiled(j);
                bool one_after_other =
                    joins_one_after_other(bs[i], bj, loops_too, i_tiled, j_tiled);
                auto key = std::make_tuple(facts[i].version, facts[j].version, one_after_other);
                auto known = pairs.find(key);
                if (known == pairs.end()) {
                    bool checks = uses(i).checks || uses(j).checks;   // sinking keeps them
                    Pair pair;
                    pair.epilogue =
                        (tiling || into_product) && i_tiled && epilogue_fusable(bs[i], bj, checks);
                    pair.fusable = pair.epilogue ||
                                   (!into_product && blocks_fusable(bs[i], bj, tiling,
                                                                    one_after_other, i_tiled,
                                                                    j_tiled, checks));
                    known = pairs.emplace(key, pair).first;
                }
                if (!known->second.fusable) continue;
                bool epilogue = known->second.epilogue;
                bool left = true, right = true;
                for (size_t k = i + 1; k < j; k++) {
                    left = left && blocks_independent(bs[k], uses(k), bs[j], uses(j));
                    right = right && blocks_independent(bs[i], uses(i), bs[k], uses(k));
                }
                if (!left && !right) continue;
                if (maps_only && !epilogue) {   // only where the loops inside fuse too
                    Block trial = bs[i], other = bs[j];
                    fuse_into(trial, other, one_after_other);
                    if (!same_maps(trial, trial)) continue;
                }
                if (sunk) bs[j] = std::move(facts[j].sunk);
                if (epilogue) fuse_epilogue(bs[i], bs[j]);
                else fuse_into(bs[i], bs[j], one_after_other);
                if (left) {
                    erase(j);
                    changed(i);
                } else {   // i merges right: the fused nest takes j's place
                    bs[j] = std::move(bs[i]);
                    changed(j);
                    erase(i);
                    i--;   // bs[i] is now the next unvisited nest
                    break;
                }
                j = i;   // look again from the fused nest
            }
        }
    }
};
static void pass_fuse_loops(Program& p) {
    std::vector<std::string> passes = passes_selected();
    bool tiling = std::find(passes.begin(), passes.end(), "tile_products") != passes.end();
    FuseSweeps sweeps(p.blocks, tiling);
    sweeps.sweep(false);
    sweeps.sweep(true);
}

// -- rows: analyses of nests whose items each walk a row (a layer norm's, a softmax's), shared
// with cuda_backend.hpp, which runs such an item by a group of threads (a warp or a block)
static void acc_updates(const std::vector<Stmt>& body, std::unordered_set<int>& out) {
    for (const Stmt& st : body) {
        if (st.kind == SK::ACC_UPDATE) out.insert(st.id);
        acc_updates(st.body, out);
    }
}
static bool has_stores(const std::vector<Stmt>& body) {
    for (const Stmt& st : body)
        if (st.kind == SK::STORE || st.kind == SK::STORE_ADD || has_stores(st.body)) return true;
    return false;
}
// A reduction loop as the accurate-sum lowering writes it: a loop whose body is acc op= value,
// or is x = identity; a chain of the same shape into x; acc op= x. A group of threads splits
// its iterations, all levels together, and combines their partial results in a fixed tree.
static bool reduction_chain(const Stmt& loop, int acc, Op op, std::vector<const Stmt*>& loops,
                            ExprP& value) {
    if (loop.kind != SK::LOOP) return false;
    loops.push_back(&loop);
    const std::vector<Stmt>& b = loop.body;
    if (b.size() == 1 && b[0].kind == SK::ACC_UPDATE && b[0].id == acc && b[0].op == op) {
        value = b[0].val;
        return true;
    }
    bool identity = b.size() == 3 && b[0].kind == SK::ACC_INIT && b[0].op == op &&
                    (op == Op::REDUCE_SUM ? is_const(b[0].val, 0)
                                          : b[0].val->kind == EK::CONST &&
                                                std::isinf(b[0].val->num) && b[0].val->num < 0);
    return identity && b[2].kind == SK::ACC_UPDATE && b[2].id == acc && b[2].op == op &&
           b[2].val->kind == EK::ACC && b[2].val->id == b[0].id &&
           reduction_chain(b[1], b[0].id, op, loops, value);
}
// The accumulator a chain reduces into (-1: the loop is not one).
static int chain_acc(const Stmt& loop, std::vector<const Stmt*>& loops, ExprP& value) {
    std::unordered_set<int> updated;
    acc_updates(loop.body, updated);
    for (int acc : updated)
        for (Op op : {Op::REDUCE_SUM, Op::REDUCE_MAX}) {
            loops.clear();
            if (reduction_chain(loop, acc, op, loops, value)) return acc;
        }
    return -1;
}
// A body that a group of threads can run together (cooperatively): each statement is an
// accumulator's initialisation or update, a check, a store, a reduction chain into an
// accumulator of 32 or 64 bits, a loop that stores and updates no accumulator outside it, or
// a loop (run by every thread) whose body runs cooperatively. (Arrays of the nest rule it out:
// each thread would have its own; the caller knows.)
static bool cooperative_body(const std::vector<Stmt>& body, std::unordered_map<int, DType>& accs) {
    for (const Stmt& st : body) {
        if (st.kind == SK::ACC_INIT) accs[st.id] = st.dtype;
        if (st.kind != SK::LOOP) continue;
        std::vector<const Stmt*> loops;
        ExprP value;
        int acc = chain_acc(st, loops, value);
        if (acc >= 0) {
            auto declared = accs.find(acc);
            if (declared == accs.end() || declared->second == DType::BOOL ||
                declared->second == DType::INDEX)
                return false;
            continue;
        }
        std::unordered_set<int> updated;
        acc_updates(st.body, updated);
        bool outer = false;
        for (int a : updated) outer = outer || accs.count(a);
        if (!outer) {
            if (!has_stores(st.body)) return false;   // nothing it does would be kept
            continue;
        }
        if (!cooperative_body(st.body, accs)) return false;
    }
    return true;
}
// Whether the items of nest b's grid loops (variables, outermost first) walk rows of their
// own: of the accesses that move with a loop of the item, none moves by one element along the
// innermost grid loop, and some move so along a loop of the item. (An item's own value, read
// once, does not count.) Up to ROWS_MAX items, each of ROW_MIN_WORK steps or more, the GPU runs
// such items by a group of threads: a thread per item would leave most of it idle and read
// memory with the threads of a warp a row apart, where a group reads each row in step.
static const int64_t ROWS_MAX = 1 << 18, ROW_MIN_WORK = 32;
static bool walks_rows(const Block& b, const std::vector<int>& grid_loops) {
    if (grid_loops.empty()) return false;
    std::unordered_set<int> grid(grid_loops.begin(), grid_loops.end());
    bool along_item = false;
    for (const Access& a : block_accesses(b).accesses) {
        bool in_item = false;   // read or written at each step of a loop of the item
        for (int v : a.loops) in_item = in_item || (!grid.count(v) && uses_var(a.idx, v));
        if (!in_item) continue;
        if (steps_by_one(a.idx, grid_loops.back())) return false;
        for (int v : a.loops)
            along_item = along_item || (!grid.count(v) && steps_by_one(a.idx, v));
    }
    return along_item;
}
// A nest's rows: its outer loops while each is the whole body of the one before.
static std::vector<Stmt*> row_loops(Block& b) {
    std::vector<Stmt*> loops;
    for (std::vector<Stmt>* body = &b.body; body->size() == 1 && (*body)[0].kind == SK::LOOP;
         body = &(*body)[0].body)
        loops.push_back(&(*body)[0]);
    return loops;
}
// Nest b joins nest a over the rows they share, the outer loops of the same extents as far as
// the shallower one's rows go: each row of a runs b's statements of that row after its own (a
// deeper nest's other loops become loops of the row). Only where each row of the result writes
// its own part of every buffer written and touches no other row's part of it (each access in
// chunks of its own at every level of the rows: `chunked`), so that no row of one reads or
// writes what a row of the other writes, and the rows can run at once. False, with a
// unchanged, otherwise.
static std::vector<int64_t> row_extents(const Block& b) {
    std::vector<int64_t> extents;
    for (const std::vector<Stmt>* body = &b.body;
         body->size() == 1 && (*body)[0].kind == SK::LOOP; body = &(*body)[0].body)
        extents.push_back(b.extents[size_t((*body)[0].id)]);
    return extents;
}
static bool fuse_rows(Block& a, const Block& b) {
    if (a.finite_site >= 0 || b.finite_site >= 0) return false;
    std::vector<int64_t> ea = row_extents(a), eb = row_extents(b);
    size_t depth = std::min(ea.size(), eb.size());
    if (depth == 0 || !std::equal(ea.begin(), ea.begin() + std::ptrdiff_t(depth), eb.begin()))
        return false;
    Block fused = a, moved = b;
    std::vector<Stmt*> la = row_loops(fused), lb = row_loops(moved);
    std::vector<int> var_of(b.extents.size(), -1);
    for (size_t d = 0; d < depth; d++) var_of[size_t(lb[d]->id)] = la[d]->id;
    for (size_t v = 0; v < var_of.size(); v++)
        if (var_of[v] < 0) {
            var_of[v] = int(fused.extents.size());
            fused.extents.push_back(b.extents[v]);
        }
    std::vector<Stmt> row = std::move(lb[depth - 1]->body);
    renumber_after(row, var_of, fused);
    for (Stmt& st : row) la[depth - 1]->body.push_back(std::move(st));
    BlockAccesses uses = block_accesses(fused);
    for (size_t d = 0; d < depth; d++) {
        std::map<int, Chunk> chunks;   // buffer → its accesses' chunk
        for (const Access& acc : uses.accesses)
            if (uses.writes(acc.buffer) &&
                !chunked(acc.idx, *la[d], fused.extents, chunks[acc.buffer]))
                return false;
    }
    take_title(fused, b);
    a = std::move(fused);
    return true;
}
// Whether nest b (rows that write apart: fuse_rows) is rows that the GPU runs well as one
// kernel, a group of threads per row: ROW_FUSE_MIN_ROWS to ROWS_MAX rows, each walking its
// own, whose statements a group can run together and that reduce (rows that only store are
// maps); no product.
static const int64_t ROW_FUSE_MIN_ROWS = 512;   // fewer would leave a GPU idle in the maps
static bool runs_as_rows(const Block& b) {
    std::vector<int> grid;
    int64_t items = 1;
    const std::vector<Stmt>* body = &b.body;
    for (; body->size() == 1 && (*body)[0].kind == SK::LOOP; body = &(*body)[0].body) {
        grid.push_back((*body)[0].id);
        items *= b.extents[size_t((*body)[0].id)];
    }
    bool reduces = false;
    for (const Stmt& st : *body) {
        std::vector<const Stmt*> loops;
        ExprP value;
        reduces = reduces || (st.kind == SK::LOOP && chain_acc(st, loops, value) >= 0);
    }
    std::unordered_map<int, DType> accs;
    ProductMatch product;
    return reduces && items >= ROW_FUSE_MIN_ROWS && items <= ROWS_MAX &&
           body->size() <= FUSED_MAX_STMTS && loop_work(*body, b.extents) >= ROW_MIN_WORK &&
           cooperative_body(*body, accs) && walks_rows(b, grid) && !match_product(b, product);
}

// -- pass_fuse_maps: elementwise nests over the same loops become one nest; so do rows
// For a device that does not fuse into row loops (the GPU: a thread per row would run each row's
// loops alone): a map (one nest of loops around stores and checks alone) joins a map over loops of
// the same extents, as pass_fuse_loops joins them (steps over nests in between, keeps each
// dependence), where the loops inside fuse too, so the fused nest is again one grid of the same
// items. A map over a product's outputs joins the product's epilogue, as pass_fuse_loops joins it
// where the CPU tiles (a GELU after a Linear, its gradient after the product that gives the GELU's
// output gradient). A value it stores and reads back then stays in a register
// (pass_substitute_temps) and one kernel does what several did. Values a map computes before a loop
// go into the loop first: each GPU thread computes them anyway. Then nests over the same rows join
// (fuse_rows) where the GPU runs the result a row to a group of threads (runs_as_rows): a layer
// norm's forward or backward, a softmax's, a loss's, one kernel each.
static void pass_fuse_maps(Program& p) {
    // values before a loop, at any level (Adam's bias corrections, a layer norm's reciprocal
    // per row), go into it
    for (Block& b : p.blocks) {
        Block sunk = b;
        bool any = false;
        for (std::vector<Stmt>* body = &sunk.body;; body = &(*body)[0].body) {
            Block level;
            level.body = std::move(*body);
            any = (level.body.size() > 1 && sink_invariants(level)) || any;
            *body = std::move(level.body);
            if (body->size() != 1 || (*body)[0].kind != SK::LOOP) break;
        }
        if (any && same_maps(sunk, sunk)) b = std::move(sunk);
    }
    FuseSweeps sweeps(p.blocks, false);
    sweeps.maps_only = true;
    sweeps.sweep(false);
    // then nests over the same rows, where the fused nest runs as rows (runs_as_rows): a layer
    // norm's statistics and normalization, a softmax's maximum, exponentials and sum, and
    // their gradients, each one kernel of a group of threads per row
    std::vector<Block>& bs = p.blocks;
    // A product's rows stay a product, which the GPU tiles: rows by columns, not a sum of
    // columns (the sum of a softmax's e^(x - max) reads the row's max along the rows).
    std::vector<bool> products;
    for (const Block& b : bs) {
        ProductMatch m;
        products.push_back(match_product(b, m) && m.rows >= 0 && !m.column_products);
    }
    for (size_t i = 0; i < bs.size(); i++) {
        for (size_t j = i + 1; j < bs.size() && j <= i + FUSE_WINDOW; j++) {
            if (products[i] || products[j]) continue;
            Block fused = bs[i];
            if (!fuse_rows(fused, bs[j]) || !runs_as_rows(fused)) continue;
            BlockAccesses ui = block_accesses(bs[i]), uj = block_accesses(bs[j]);
            // a failed bounds check stops the program before in-place writes: keep them apart
            if ((ui.checks || uj.checks) && fused.writes_in_place) continue;
            bool left = true, right = true;   // j moves to i, or i to j, past those between
            for (size_t k = i + 1; k < j; k++) {
                BlockAccesses uk = block_accesses(bs[k]);
                left = left && blocks_independent(bs[k], uk, bs[j], uj);
                right = right && blocks_independent(bs[i], ui, bs[k], uk);
            }
            if (!left && !right) continue;
            if (left) {
                bs[i] = std::move(fused);
                bs.erase(bs.begin() + std::ptrdiff_t(j));
                products.erase(products.begin() + std::ptrdiff_t(j));
            } else {
                bs[j] = std::move(fused);
                bs.erase(bs.begin() + std::ptrdiff_t(i));
                products.erase(products.begin() + std::ptrdiff_t(i));
                i--;   // bs[i] is now the next unvisited nest
                break;
            }
            j = i;   // look again from the fused nest
        }
    }
}

// -- pass_substitute_temps: a value stored and read back at the same index in one nest
// A buffer stored once in a block, then read in the statements after the store at the same
// index, is read from a local instead; a temporary read nowhere else loses its store
// (pass_dead_stores).
static void substitute_stores(std::vector<Stmt>& body, const BlockAccesses& uses,
                              int& next_local) {
    for (size_t p = 0; p < body.size(); p++) {
        Stmt& st = body[p];
        if (st.kind == SK::LOOP) { substitute_stores(st.body, uses, next_local); continue; }
        if (st.kind != SK::STORE) continue;
        int stores = 0;
        for (const Access& a : uses.accesses) stores += a.write && a.buffer == st.id;
        if (stores != 1) continue;
        int buffer = st.id, local = next_local;
        ExprP idx = st.idx, ref = ex_acc(local, st.dtype);
        bool replaced = false;
        Rewritten done;
        auto loads = [&](const ExprP& e) -> ExprP {
            if (e->kind != EK::LOAD || e->id != buffer || !expr_eq(e->src[0], idx)) return nullptr;
            replaced = true;
            return ref;
        };
        for (size_t q = p + 1; q < body.size(); q++) {
            std::vector<Stmt> one(1, std::move(body[q]));
            substitute(one, loads, done);
            body[q] = std::move(one[0]);
        }
        if (!replaced) continue;
        next_local++;
        Stmt store = st_store(buffer, st.dtype, idx, ref);
        body[p] = st_local(local, st.dtype, st.val);
        body.insert(body.begin() + std::ptrdiff_t(p) + 1, std::move(store));
        p++;
    }
}
static void pass_substitute_temps(Program& p) {
    for (Block& b : p.blocks) {
        BlockAccesses uses = block_accesses(b);
        int next_local = accumulators_used(b.body);
        substitute_stores(b.body, uses, next_local);
    }
}

// -- pass_dead_stores: stores nobody reads, and the code only they needed
// A temporary that no block reads loses its stores; then accumulators and locals that nothing
// reads, and loops left empty, go too. The bounds checks of a statement that goes stay, as
// check statements: a check is an effect.
static void checks_in(const ExprP& e, std::vector<ExprP>& out) {
    ExprSet seen;
    each_part(e, seen, [&](const ExprP& part) {
        if (part->kind == EK::CHECK) out.push_back(part);
    });
}
static bool drop_dead(std::vector<Stmt>& body, const std::vector<bool>& buffer_read,
                      const std::unordered_set<int>& acc_read) {
    bool changed = false;
    std::vector<Stmt> out;
    for (Stmt& st : body) {
        if (st.kind == SK::LOOP) changed = drop_dead(st.body, buffer_read, acc_read) || changed;
        bool dead = false;
        if (st.kind == SK::LOOP) dead = st.body.empty();
        if (st.kind == SK::STORE || st.kind == SK::STORE_ADD) dead = !buffer_read[size_t(st.id)];
        if (st.kind == SK::ACC_INIT || st.kind == SK::ACC_UPDATE) dead = !acc_read.count(st.id);
        if (!dead) {
            out.push_back(std::move(st));
            continue;
        }
        changed = true;
        std::vector<ExprP> checks;   // what the dead statement checked is still checked
        checks_in(st.idx, checks);
        checks_in(st.val, checks);
        for (ExprP& c : checks) out.push_back(st_check(c));
    }
    body = std::move(out);
    return changed;
}
static void pass_dead_stores(Program& p) {
    std::vector<bool> buffer_read(p.buffers.size());
    for (size_t i = 0; i < p.buffers.size(); i++)
        buffer_read[i] = p.buffers[i].role != ProgramBuffer::TEMP;   // outputs are read later
    for (const Block& b : p.blocks) {
        for (const Access& a : block_accesses(b).accesses)
            if (!a.write) buffer_read[size_t(a.buffer)] = true;
        if (b.finite_site >= 0) buffer_read[size_t(b.finite_buffer)] = true;   // TG_CHECK reads
    }
    for (Block& b : p.blocks) {
        bool changed = true;
        while (changed) {
            std::unordered_set<int> acc_read;
            accs_read(b.body, acc_read);
            changed = drop_dead(b.body, buffer_read, acc_read);
        }
    }
    p.blocks.erase(std::remove_if(p.blocks.begin(), p.blocks.end(),
                                  [](const Block& b) { return b.body.empty(); }),
                   p.blocks.end());
}

// -- pass_first_write: a short accumulation starts from its first term, not from zero
//   acc = 0; acc += f(0)                       becomes   acc = f(0)
//   acc = 0; for v < 2: acc += f(v)            becomes   acc = f(0); acc += f(1)
// (the same for max from -inf). The C compiler may not drop 0 + x itself (it is not x when x
// is -0). Longer loops keep their zero start: peeled, they vectorize worse (measured on W2:
// 8% slower).
static void first_write(Block& b, std::vector<Stmt>& body) {
    for (size_t p = 0; p < body.size(); p++) {
        if (body[p].kind == SK::LOOP) first_write(b, body[p].body);
        if (p + 1 >= body.size()) continue;
        Stmt &init = body[p], &next = body[p + 1];
        if (init.kind != SK::ACC_INIT || !is_const(init.val, acc_identity(init.op, init.dtype)))
            continue;
        auto updates_init = [&](const Stmt& st) {
            return st.kind == SK::ACC_UPDATE && st.id == init.id && st.op == init.op;
        };
        if (updates_init(next)) {   // acc = 0; acc += x
            init.val = next.val;
            body.erase(body.begin() + std::ptrdiff_t(p) + 1);
            continue;
        }
        if (next.kind != SK::LOOP || next.body.size() != 1 || !updates_init(next.body[0]) ||
            b.extents[size_t(next.id)] != 2)
            continue;
        SimplifyMemo memo{&b.extents, {}};
        std::vector<Stmt> first{next.body[0]}, second{next.body[0]};
        substitute_var(first, next.id, ix(0));
        init.val = simplify(first[0].val, memo);
        substitute_var(second, next.id, ix(1));
        second[0].val = simplify(second[0].val, memo);
        body[p + 1] = std::move(second[0]);
    }
}
static void pass_first_write(Program& p) {
    for (Block& b : p.blocks) first_write(b, b.body);
}

// -- pass_local_temps: a temporary used inside one nest only becomes an array of that nest
// When every access to it lies in one loop of one block, in chunks of that loop's variable
// (index = v·S + base + r, 0 <= r < S, as fuse_loops checks), iteration v writes and reads
// only its own S elements: the temporary becomes an array of S declared in the loop's body
// (on the C stack, so in cache), indexed by r. One used in one block in no such loop becomes
// an array of the block's function when it is small. Either way it takes no arena space.
static const int64_t LOCAL_MAX_BYTES = 16384;
static const Stmt* find_loop(const std::vector<Stmt>& body, int var) {
    for (const Stmt& st : body) {
        if (st.kind != SK::LOOP) continue;
        if (st.id == var) return &st;
        if (const Stmt* inner = find_loop(st.body, var)) return inner;
    }
    return nullptr;
}
static void pass_local_temps(Program& p) {
    std::vector<int> block_of(p.buffers.size(), -1);   // -2: touched by several blocks
    std::vector<BlockAccesses> uses;
    for (size_t k = 0; k < p.blocks.size(); k++) {
        uses.push_back(block_accesses(p.blocks[k]));
        auto touch = [&](int buffer) {
            int& b = block_of[size_t(buffer)];
            b = b == -1 || b == int(k) ? int(k) : -2;
        };
        for (const Access& a : uses.back().accesses) touch(a.buffer);
        if (p.blocks[k].finite_site >= 0) block_of[size_t(p.blocks[k].finite_buffer)] = -2;
    }
    for (size_t t = 0; t < p.buffers.size(); t++) {
        ProgramBuffer& buf = p.buffers[t];
        if (buf.role != ProgramBuffer::TEMP || block_of[t] < 0) continue;
        Block& b = p.blocks[size_t(block_of[t])];
        std::vector<const Access*> mine;
        for (const Access& a : uses[size_t(block_of[t])].accesses)
            if (a.buffer == int(t)) mine.push_back(&a);
        std::vector<int> common = mine[0]->loops;   // the loops around every access
        for (const Access* a : mine) {
            size_t n = 0;
            while (n < common.size() && n < a->loops.size() && common[n] == a->loops[n]) n++;
            common.resize(n);
        }
        int64_t elem = int64_t(dtype_size(buf.dtype));
        for (auto v = common.rbegin(); v != common.rend(); ++v) {   // innermost first
            const Stmt* loop = find_loop(b.body, *v);
            Chunk chunk;
            bool chunked_all = true;
            for (const Access* a : mine)
                chunked_all = chunked_all && chunked(a->idx, *loop, b.extents, chunk);
            if (!chunked_all || chunk.stride * elem > LOCAL_MAX_BYTES) continue;
            ExprP start = ix_add(ix_mul(ex_var(*v), chunk.stride), chunk.base);
            SimplifyMemo memo{&b.extents, {}};
            Rewritten done;
            auto relative = [&](const ExprP& idx) {
                return simplify(ix_add(idx, ix_mul(start, -1)), memo);
            };
            substitute(b.body, [&](const ExprP& e) -> ExprP {
                if (e->kind != EK::LOAD || e->id != int(t)) return nullptr;
                return ex_load(int(t), e->dtype, relative(e->src[0]));
            }, done);
            std::function<void(std::vector<Stmt>&)> stores = [&](std::vector<Stmt>& body) {
                for (Stmt& st : body) {
                    if ((st.kind == SK::STORE || st.kind == SK::STORE_ADD) && st.id == int(t))
                        st.idx = relative(st.idx);
                    stores(st.body);
                }
            };
            stores(b.body);
            buf.numel = chunk.stride;
            buf.local_loop = *v;
            break;
        }
        if (buf.local_loop < 0 && buf.numel * elem > LOCAL_MAX_BYTES) continue;
        buf.local_block = block_of[t];
    }
}

// -- pass_sum_lanes: a long float sum as vector lanes
// Lowering sums a long axis in blocks of SUM_BLOCK: each block's terms in order, then the blocks'
// sums in order, so the rounding error grows with the logarithm of the length. Each block's sum is
// one chain of dependent additions, which a C compiler may not reorder, so it runs at one addition
// per adder latency (or is vectorized through shuffles). Here a run of blocks becomes SUM_BLOCK
// lanes instead: lane j adds the j-th term of every block, in block order, and the lanes are summed
// as a balanced tree ((l0 + l1) + (l2 + l3)) + ... The lanes are independent accumulators reading
// consecutive elements: one vector addition per block. The order depends only on the shape (the
// same bits on every run and thread count, and on INTERP, which runs the passes too); it differs
// from the order as lowered (TG_PASSES without sum_lanes) by rounding. The term is written once per
// lane, so a term larger than LANES_MAX_TERM expression nodes keeps the blocked order; tiled
// products have their own order (pass_tile_products) and are not touched. Nor are other sums of
// products (x·x): their lanes are 16 fmaf calls, which gcc 12 leaves scalar (measured: a row sum of
// squares 20% slower as lanes, where plain and exp sums run 1.8-2x faster); nor sums whose terms do
// not read neighbouring elements from lane to lane (a column's sum: with W3's bias gradients as
// lanes of strided loads its step took about 10% longer, one measurement).
static const size_t LANES_MAX_TERM = 40;
static_assert((Lowering::SUM_BLOCK & (Lowering::SUM_BLOCK - 1)) == 0,
              "the lanes are added in pairs, level by level");
// body[p], body[p+1] = acc a = 0; for v { acc c = 0; for w < SUM_BLOCK { c += term }; a += c }
static bool blocked_sum_at(const std::vector<Stmt>& body, size_t p,
                           const std::vector<int64_t>& extents) {
    if (p + 1 >= body.size()) return false;
    const Stmt &init = body[p], &outer = body[p + 1];
    if (init.kind != SK::ACC_INIT || init.op != Op::REDUCE_SUM || !dtype_is_float(init.dtype) ||
        !is_const(init.val, 0) || outer.kind != SK::LOOP || outer.body.size() != 3)
        return false;
    const Stmt &c_init = outer.body[0], &inner = outer.body[1], &into = outer.body[2];
    if (c_init.kind != SK::ACC_INIT || c_init.op != Op::REDUCE_SUM ||
        c_init.dtype != init.dtype || !is_const(c_init.val, 0) || inner.kind != SK::LOOP ||
        extents[size_t(inner.id)] != Lowering::SUM_BLOCK || inner.body.size() != 1 ||
        into.kind != SK::ACC_UPDATE || into.id != init.id || into.op != Op::REDUCE_SUM ||
        into.val->kind != EK::ACC || into.val->id != c_init.id)
        return false;
    const Stmt& update = inner.body[0];
    if (update.kind != SK::ACC_UPDATE || update.id != c_init.id || update.op != Op::REDUCE_SUM ||
        fused_term(update))
        return false;
    size_t nodes = 0;
    bool along = false, all_along = true;   // lanes read neighbours: vector loads
    ExprSet seen;
    each_part(update.val, seen, [&](const ExprP& part) {
        nodes++;
        if (part->kind != EK::LOAD || !uses_var(part->src[0], inner.id)) return;
        bool one = steps_by_one(part->src[0], inner.id);
        along = along || one;
        all_along = all_along && one;
    });
    return nodes <= LANES_MAX_TERM && along && all_along;
}
static void sum_lanes(std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                      int& next_acc, SimplifyMemo& memo) {
    for (size_t p = 0; p < body.size(); p++) {
        if (!blocked_sum_at(body, p, extents)) {
            sum_lanes(body[p].body, extents, next_acc, memo);
            continue;
        }
        Stmt loop = std::move(body[p + 1]);
        const Stmt inner = std::move(loop.body[1]);
        int total = body[p].id, lane0 = next_acc;
        DType dt = body[p].dtype;
        next_acc += int(Lowering::SUM_BLOCK);
        std::vector<Stmt> lanes_sum;   // the lanes' starts, their loop, the tree
        std::vector<ExprP> lanes;
        loop.body.clear();
        for (int j = 0; j < int(Lowering::SUM_BLOCK); j++) {
            lanes_sum.push_back(st_acc_init(lane0 + j, Op::REDUCE_SUM, dt));
            std::vector<Stmt> lane(1, inner.body[0]);
            lane[0].id = lane0 + j;
            substitute_var(lane, inner.id, ix(j));
            lane[0].val = simplify(lane[0].val, memo);
            loop.body.push_back(std::move(lane[0]));
            lanes.push_back(ex_acc(lane0 + j, dt));
        }
        while (lanes.size() > 1) {   // pairs of neighbours, level by level
            std::vector<ExprP> up;
            for (size_t i = 0; i < lanes.size(); i += 2)
                up.push_back(ex_alu(Op::ADD, dt, {lanes[i], lanes[i + 1]}));
            lanes = std::move(up);
        }
        lanes_sum.push_back(std::move(loop));
        lanes_sum.push_back(st_local(total, dt, lanes[0]));
        body.erase(body.begin() + std::ptrdiff_t(p), body.begin() + std::ptrdiff_t(p) + 2);
        body.insert(body.begin() + std::ptrdiff_t(p), std::make_move_iterator(lanes_sum.begin()),
                    std::make_move_iterator(lanes_sum.end()));
        p += lanes_sum.size() - 1;   // at the tree
    }
}
static void pass_sum_lanes(Program& p) {
    for (Block& b : p.blocks) {
        if (b.tile.rows) continue;
        int next_acc = accumulators_used(b.body);
        SimplifyMemo memo{&b.extents, {}};
        sum_lanes(b.body, b.extents, next_acc, memo);
    }
}

// -- pass_split_divided: a loop whose variable is divided by a constant, as two loops
// A max pool's gradient reads the index and the gradient its window kept at (i / 2, j / 2) and
// compares the index with (i % 2, j % 2); an average pool's reads its window's at (i / 2,
// j / 2). A division in every element's index keeps the C compiler from vectorizing the loop
// (C1's pool gradient nest, its C function timed alone on one thread: 3.3 ms; with the loops
// split so, written by hand, 1.4 ms).
// A loop of n iterations whose body divides its variable by d, or takes it modulo d, where d
// divides n, runs as a loop of n / d around one of d, the variable being q·d + r; simplify
// folds (q·d + r) / d to q and the remainder to r. The iterations keep their order: the bits
// do not change. Kept only where no / or % of q or r is left. Not split: a nest's outer loop
// (parallel_loops cuts it), tiled nests and a loop that holds an array.
// the d that split var's loop: (k·var + ...) / c asks for c / gcd(c, k)
static std::set<int64_t> divisors_of(const std::vector<Stmt>& body, int var, int64_t extent) {
    std::set<int64_t> divisors;
    each_division(body, [&](const Expr& division) {
        if (division.src[1]->kind != EK::CONST || !uses_var(division.src[0], var)) return;
        int64_t c = int64_t(division.src[1]->num), k = 1;
        Linear lin;
        lin.add(1, division.src[0]);
        for (auto& [coef, term] : lin.terms)
            if (term->kind == EK::VAR && term->id == var) k = coef;
        int64_t d = c / std::gcd(c, std::abs(k));
        if (d > 1 && d < extent && extent % d == 0) divisors.insert(d);
    });
    return divisors;
}
static void split_divided(std::vector<Stmt>& body, std::vector<int64_t>& extents, bool outer,
                          const std::unordered_set<int>& array_loops) {
    for (Stmt& loop : body) {
        if (loop.kind != SK::LOOP) continue;
        split_divided(loop.body, extents, false, array_loops);
        if (outer || array_loops.count(loop.id)) continue;
        int64_t extent = extents[size_t(loop.id)];
        for (int64_t d : divisors_of(loop.body, loop.id, extent)) {
            std::vector<int64_t> split = extents;
            int q = int(split.size()), r = q + 1;
            split.push_back(extent / d);
            split.push_back(d);
            Stmt inner = st_loop(r);
            inner.body = loop.body;
            substitute_var(inner.body, loop.id, ix_add(ix_mul(ex_var(q), d), ex_var(r)));
            SimplifyMemo memo{&split, {}};
            simplify_stmts(inner.body, memo);
            bool divided = false;
            each_division(inner.body, [&](const Expr& division) {
                divided = divided || uses_var(division.src[0], q) || uses_var(division.src[0], r);
            });
            if (divided) continue;
            extents = std::move(split);
            loop.id = q;
            loop.body = {std::move(inner)};
            break;
        }
    }
}
static std::unordered_set<int> loops_holding_arrays(const Program& p, size_t block) {
    std::unordered_set<int> loops;
    for (const ProgramBuffer& pb : p.buffers)
        if (pb.local_block == int(block)) loops.insert(pb.local_loop);
    return loops;
}
static void pass_split_divided(Program& p) {
    for (size_t k = 0; k < p.blocks.size(); k++)
        if (!p.blocks[k].tile.rows)
            split_divided(p.blocks[k].body, p.blocks[k].extents, true, loops_holding_arrays(p, k));
}

// -- pass_split_at_edges: a loop as one loop per stretch between the edges its body tests
// A pad, or a concatenation's gradient, reads each part of an axis under a comparison of the
// axis's variable with a constant (i < 256 ? 0 : x[i - 256]), decided anew for every element,
// which keeps the C compiler from vectorizing the loop (W5's qkv gradient took 4.5% of its
// step). A loop whose body compares its variable plus a constant with a constant inside its
// range runs as one loop for each stretch between those edges, in order, the variable being
// the stretch's start plus a variable of its own; simplify then decides each comparison, and
// the selects go. Each element is computed by the same operations as before: the bits do not
// change. Not split: a nest's outer loop (parallel_loops cuts it), tiled nests, a loop that
// holds an array of its own or of a loop inside it (local_temps names that loop; the loops
// around it may split: a convolution's padded sum of its positions' gradients, into an array
// for each channel's plane), and loops whose iterations share an accumulator.
static const size_t SPLIT_MAX_PIECES = 8;
// the values of var where a comparison var + k < c, or c < var + k, in body changes
static std::set<int64_t> edges_of(const std::vector<Stmt>& body, int var, int64_t extent) {
    std::set<int64_t> edges;
    ExprSet seen;
    auto visit = [&](const ExprP& part) {
        if (part->kind != EK::ALU || part->op != Op::CMPLT || part->src[0]->dtype != DType::INDEX)
            return;
        for (size_t side = 0; side < 2; side++) {
            const ExprP& c = part->src[1 - side];
            Linear lin;
            lin.add(1, part->src[side]);
            if (c->kind != EK::CONST || lin.terms.size() != 1 || lin.terms[0].first != 1 ||
                lin.terms[0].second->kind != EK::VAR || lin.terms[0].second->id != var)
                continue;
            int64_t edge = int64_t(c->num) - lin.constant + int64_t(side);   // c < v + k: v > c - k
            if (edge > 0 && edge < extent) edges.insert(edge);
        }
    };
    std::function<void(const std::vector<Stmt>&)> walk = [&](const std::vector<Stmt>& stmts) {
        for (const Stmt& st : stmts) {
            each_part(st.idx, seen, visit);
            each_part(st.val, seen, visit);
            walk(st.body);
        }
    };
    walk(body);
    return edges;
}
static bool holds_loop(const Stmt& loop, const std::unordered_set<int>& vars) {
    if (vars.count(loop.id)) return true;
    for (const Stmt& st : loop.body)
        if (st.kind == SK::LOOP && holds_loop(st, vars)) return true;
    return false;
}
// array_loops: the loops that hold arrays (local_temps)
static void split_at_edges(std::vector<Stmt>& body, std::vector<int64_t>& extents, int& next_acc,
                           bool outer, const std::unordered_set<int>& array_loops) {
    for (size_t p = 0; p < body.size(); p++) {
        if (body[p].kind != SK::LOOP) continue;
        split_at_edges(body[p].body, extents, next_acc, false, array_loops);
        if (outer || holds_loop(body[p], array_loops)) continue;
        const Stmt& loop = body[p];   // until it is erased, after its pieces are made
        int64_t extent = extents[size_t(loop.id)];
        std::set<int64_t> edges = edges_of(loop.body, loop.id, extent);
        if (edges.empty() || edges.size() + 1 > SPLIT_MAX_PIECES) continue;
        std::unordered_set<int> updated, started;   // accumulators the body sets, and starts
        accs_set(loop.body, updated);
        accs_set(loop.body, started, true);
        if (!std::all_of(updated.begin(), updated.end(),
                         [&](int acc) { return started.count(acc) > 0; }))
            continue;
        std::vector<int64_t> at{0};
        at.insert(at.end(), edges.begin(), edges.end());
        at.push_back(extent);
        auto mapped = [](const std::unordered_map<int, int>& to) {   // others keep theirs
            return [&to](int id) {
                auto it = to.find(id);
                return it == to.end() ? id : it->second;
            };
        };
        std::vector<Stmt> pieces;
        for (size_t k = 0; k + 1 < at.size(); k++) {
            // each piece's loops and accumulators are its own (a C variable is declared once)
            Stmt piece = loop;
            std::unordered_map<int, int> var_of, acc_of;
            std::function<void(const std::vector<Stmt>&)> fresh = [&](const std::vector<Stmt>& in) {
                for (const Stmt& st : in) {
                    if (st.kind != SK::LOOP) continue;
                    var_of[st.id] = int(extents.size());
                    extents.push_back(extents[size_t(st.id)]);
                    fresh(st.body);
                }
            };
            fresh(loop.body);
            for (int acc : updated) acc_of[acc] = next_acc++;
            renumber(piece.body, mapped(var_of), mapped(acc_of));
            int var = int(extents.size());
            extents.push_back(at[k + 1] - at[k]);
            substitute_var(piece.body, loop.id, ix_add(ex_var(var), ix(at[k])));
            piece.id = var;
            pieces.push_back(std::move(piece));
        }
        body.erase(body.begin() + std::ptrdiff_t(p));
        body.insert(body.begin() + std::ptrdiff_t(p), pieces.begin(), pieces.end());
        p += pieces.size() - 1;
    }
}
static void pass_split_at_edges(Program& p) {
    for (size_t k = 0; k < p.blocks.size(); k++) {
        Block& b = p.blocks[k];
        if (b.tile.rows) continue;
        size_t vars = b.extents.size();
        int next_acc = accumulators_used(b.body);
        split_at_edges(b.body, b.extents, next_acc, true, loops_holding_arrays(p, k));
        if (b.extents.size() == vars) continue;
        SimplifyMemo memo{&b.extents, {}};
        simplify_stmts(b.body, memo);
    }
}

// -- pass_parallel_loops: nests whose outer iterations write disjoint parts run on threads
// A block that is one loop, in which every buffer written is accessed in chunks of the loop
// variable (as fuse_loops checks; arrays local to the loop are each iteration's own), may run
// its iterations in any order. Its range is cut into a number of chunks that depends only on
// its extent, and each iteration computes what it computes alone, so results are the same bits
// on any number of threads. A nest of little work (fewer than PARALLEL_MIN_WORK iterations of
// its loops, all counted) runs on the calling thread: waking a thread costs microseconds.
static int64_t loop_work(const std::vector<Stmt>& body, const std::vector<int64_t>& extents) {
    int64_t n = 0;
    for (const Stmt& st : body)
        n += st.kind != SK::LOOP ? 1
                                 : extents[size_t(st.id)] *
                                       std::max<int64_t>(1, loop_work(st.body, extents));
    return n;
}
static void pass_parallel_loops(Program& p) {
    for (size_t k = 0; k < p.blocks.size(); k++) {
        Block& b = p.blocks[k];
        if (b.tile.rows || b.body.size() != 1 || b.body[0].kind != SK::LOOP ||
            loop_work(b.body, b.extents) < parallel_min_work(PARALLEL_MIN_WORK))
            continue;
        const Stmt& loop = b.body[0];
        bool disjoint = true;
        for (const ProgramBuffer& pb : p.buffers)   // an array of the function is shared
            disjoint = disjoint && !(pb.local_block == int(k) && pb.local_loop < 0);
        BlockAccesses uses = block_accesses(b);
        std::map<int, Chunk> chunks;
        for (const Access& a : uses.accesses) {
            if (!uses.writes(a.buffer) || p.buffers[size_t(a.buffer)].local_block == int(k))
                continue;
            disjoint = disjoint && chunked(a.idx, loop, b.extents, chunks[a.buffer]);
        }
        if (disjoint) b.parallel_chunks = std::min(b.extents[size_t(loop.id)], PARALLEL_CHUNKS);
    }
}

static int64_t temp_bytes(const ProgramBuffer& b) { return b.numel * int64_t(dtype_size(b.dtype)); }

// -- pass_order_nests: nests in an order that ends temporaries early
// Lowering orders nests as the graph's sort found them: the forward pass, the gradients, then
// each weight's gradient and update at the end, which keeps every activation alive to the end.
// Here each step runs, of the nests whose dependences have run, the one that frees the most
// temporary bytes net of those it starts (ties: the earlier nest), so a weight's gradient runs
// as soon as its inputs exist and the activations it reads end there. A nest depends on the
// last nest that wrote a buffer it touches, and a writer on the readers since; nests with a
// bounds or finite check keep their order with nests that write in place. Values do not
// change: every nest reads what it read before.
static void pass_order_nests(Program& p) {
    size_t n = p.blocks.size();
    std::vector<std::vector<size_t>> next(n);   // the nests that wait for each
    std::vector<int> waiting(n, 0);
    std::vector<std::vector<int>> touched(n);   // buffers, each once
    std::vector<int> uses(p.buffers.size(), 0);
    std::map<int, size_t> last_writer;
    std::map<int, std::vector<size_t>> readers_since;
    std::vector<size_t> checked, in_place;
    auto after = [&](size_t before, size_t k) {
        next[before].push_back(k);
        waiting[k]++;
    };
    for (size_t k = 0; k < n; k++) {
        const Block& b = p.blocks[k];
        BlockAccesses acc = block_accesses(b);
        if (b.finite_site >= 0) acc.accesses.push_back({b.finite_buffer, nullptr, false, {}});
        std::set<int> reads, writes;
        for (const Access& a : acc.accesses) (a.write ? writes : reads).insert(a.buffer);
        for (int buf : reads) {
            if (last_writer.count(buf)) after(last_writer[buf], k);
            if (!writes.count(buf)) readers_since[buf].push_back(k);
        }
        for (int buf : writes) {
            if (last_writer.count(buf)) after(last_writer[buf], k);
            for (size_t r : readers_since[buf]) after(r, k);
            readers_since[buf].clear();
            last_writer[buf] = k;
        }
        bool checks = acc.checks || b.finite_site >= 0;
        if (checks)
            for (size_t w : in_place) after(w, k);
        if (b.writes_in_place)
            for (size_t c : checked) after(c, k);
        if (checks) checked.push_back(k);
        if (b.writes_in_place) in_place.push_back(k);
        std::set_union(reads.begin(), reads.end(), writes.begin(), writes.end(),
                       std::back_inserter(touched[k]));
        for (int buf : touched[k]) uses[size_t(buf)]++;
    }
    auto temp = [&](int buf) { return p.buffers[size_t(buf)].role == ProgramBuffer::TEMP; };
    std::vector<bool> started(p.buffers.size(), false);
    std::set<size_t> ready;
    for (size_t k = 0; k < n; k++)
        if (!waiting[k]) ready.insert(k);
    std::vector<Block> ordered;
    while (!ready.empty()) {
        size_t best = *ready.begin();
        int64_t best_net = INT64_MAX;
        for (size_t k : ready) {
            int64_t net = 0;
            for (int buf : touched[k]) {
                if (!temp(buf)) continue;
                if (!started[size_t(buf)]) net += temp_bytes(p.buffers[size_t(buf)]);
                if (uses[size_t(buf)] == 1) net -= temp_bytes(p.buffers[size_t(buf)]);
            }
            if (net < best_net) best = k, best_net = net;
        }
        ready.erase(best);
        for (int buf : touched[best]) {
            started[size_t(buf)] = true;
            uses[size_t(buf)]--;
        }
        for (size_t k : next[best])
            if (--waiting[k] == 0) ready.insert(k);
        ordered.push_back(std::move(p.blocks[best]));
    }
    p.blocks = std::move(ordered);
}

// -- pass_plan_memory: temporaries share one arena by lifetime
// A temporary lives from the first block that touches it to the last. Largest first (ties by
// number, so the plan depends only on the program), each takes the lowest 64-byte-aligned
// offset that overlaps no placed temporary whose lifetime overlaps its own. Inputs, outputs
// and buffers assigned in place are never in the arena. A temporary no block touches (its
// stores were removed) takes no space.
static void pass_plan_memory(Program& p) {
    size_t n = p.buffers.size();
    std::vector<int> first(n, -1), last(n, -1);
    for (size_t k = 0; k < p.blocks.size(); k++) {
        auto touch = [&](int buffer) {
            if (first[size_t(buffer)] < 0) first[size_t(buffer)] = int(k);
            last[size_t(buffer)] = int(k);
        };
        for (const Access& a : block_accesses(p.blocks[k]).accesses) touch(a.buffer);
        if (p.blocks[k].finite_site >= 0) touch(p.blocks[k].finite_buffer);
    }
    std::vector<size_t> temps;
    for (size_t i = 0; i < n; i++)
        if (p.buffers[i].role == ProgramBuffer::TEMP && p.buffers[i].local_block < 0)
            temps.push_back(i);
    std::stable_sort(temps.begin(), temps.end(), [&](size_t a, size_t b) {
        return temp_bytes(p.buffers[a]) > temp_bytes(p.buffers[b]);
    });
    const int64_t align = 64;
    std::vector<size_t> placed;
    p.arena_bytes = 0;
    for (size_t t : temps) {
        ProgramBuffer& buf = p.buffers[t];
        if (first[t] < 0) { buf.offset = 0; continue; }
        int64_t size = temp_bytes(buf);
        std::vector<std::pair<int64_t, int64_t>> busy;   // [begin, end) of live neighbours
        for (size_t o : placed)
            if (first[o] <= last[t] && first[t] <= last[o])
                busy.push_back(
                    {p.buffers[o].offset, p.buffers[o].offset + temp_bytes(p.buffers[o])});
        std::sort(busy.begin(), busy.end());
        int64_t at = 0;
        for (auto& [begin, end] : busy) {
            if (at + size <= begin) break;
            at = std::max(at, (end + align - 1) / align * align);
        }
        buf.offset = at;
        p.arena_bytes = std::max(p.arena_bytes, at + size);
        placed.push_back(t);
    }
}

// The pipeline's passes in order; each is a function of the whole program. TG_PASSES names
// the ones to run (default all; none runs the IR as lowered), so a wrong result can be
// bisected to a pass.
static const std::vector<std::pair<const char*, void (*)(Program&)>> PASSES = {
    {"simplify", pass_simplify},
    {"fuse_loops", pass_fuse_loops},
    {"fuse_maps", pass_fuse_maps},
    {"substitute_temps", pass_substitute_temps},
    {"dead_stores", pass_dead_stores},
    {"first_write", pass_first_write},
    {"order_nests", pass_order_nests},
    {"local_temps", pass_local_temps},
    {"tile_products", pass_tile_products},
    {"sum_lanes", pass_sum_lanes},
    {"split_divided", pass_split_divided},
    {"split_at_edges", pass_split_at_edges},
    {"parallel_loops", pass_parallel_loops},
    {"plan_memory", pass_plan_memory},
};

static std::vector<std::string> passes_selected() {
    std::string spec = env_str("TG_PASSES", "all"), known;
    std::vector<std::string> names, chosen;
    for (auto& [name, pass] : PASSES) {
        names.push_back(name);
        known += std::string(known.empty() ? "" : ",") + name;
    }
    if (spec == "all") return names;
    if (spec == "none") return {};
    std::stringstream list(spec);
    for (std::string want; std::getline(list, want, ',');) {
        if (std::find(names.begin(), names.end(), want) == names.end())
            fail("TG_PASSES: unknown pass '" + want + "' (passes: " + known +
                 "; or all, or none)");
        chosen.push_back(want);
    }
    return chosen;
}

static void run_passes(Program& p, const Device* dev = nullptr) {
    std::vector<std::string> chosen = passes_selected();
    for (auto& [name, pass] : PASSES)
        if (std::find(chosen.begin(), chosen.end(), name) != chosen.end() &&
            (!dev || dev->runs_pass(name)))
            pass(p);
    p.work = 0;   // the statements it runs, each counted once per iteration of its loops
    for (const Block& b : p.blocks) p.work += loop_work(b.body, b.extents);
}

TG_COLD_END
// ---- [INTERP] the reference interpreter over the loop IR ------------------------------- >>interp
// Executes a Program statement by statement, with alu_eval as the meaning of each op. It is
// the definition the compiled code must agree with (tests compare them on random graphs) and
// the device for machines without a C compiler (TG_DEVICE=INTERP).

static Num load_value(const void* buf, DType dt, int64_t i) {
    Num n;
    switch (dt) {
    case DType::BOOL: n.i = static_cast<const uint8_t*>(buf)[i]; break;
    case DType::INT32: n.i = static_cast<const int32_t*>(buf)[i]; break;
    case DType::INT64: case DType::INDEX: n.i = static_cast<const int64_t*>(buf)[i]; break;
    case DType::FLOAT32: n.f = static_cast<const float*>(buf)[i]; break;
    case DType::FLOAT64: n.f = static_cast<const double*>(buf)[i]; break;
    }
    return n;
}
static void store_value(void* buf, DType dt, int64_t i, Num v) {
    switch (dt) {
    case DType::BOOL: static_cast<uint8_t*>(buf)[i] = v.i != 0; break;
    case DType::INT32: static_cast<int32_t*>(buf)[i] = int32_t(v.i); break;
    case DType::INT64: case DType::INDEX: static_cast<int64_t*>(buf)[i] = v.i; break;
    case DType::FLOAT32: static_cast<float*>(buf)[i] = float(v.f); break;
    case DType::FLOAT64: static_cast<double*>(buf)[i] = v.f; break;
    }
}

struct Interpreter : Executable {
    Program prog;
    void* const* bufs = nullptr;
    int64_t* err = nullptr;
    std::vector<Num> vars, accs;
    std::unordered_set<const Expr*> shared;        // used twice within one statement
    std::unordered_map<const Expr*, Num> known;    // their values in the current statement

    explicit Interpreter(Program p) : prog(std::move(p)) {
        for (const Block& b : prog.blocks) find_shared(b.body);
    }

    void find_shared(const std::vector<Stmt>& body) {
        for (const Stmt& st : body) {
            std::unordered_map<const Expr*, int> uses;
            for (const ExprP& e : {st.idx, st.val})
                if (e) count_uses(e.get(), uses);
            for (auto& [e, n] : uses)
                if (n > 1 && e->kind == EK::ALU) shared.insert(e);
            find_shared(st.body);
        }
    }

    Num eval(const Expr& e) {
        if (!shared.count(&e)) return compute(e);
        auto it = known.find(&e);
        if (it != known.end()) return it->second;
        return known[&e] = compute(e);
    }

    Num compute(const Expr& e) {
        switch (e.kind) {
        case EK::CONST: return num_of(e.num, e.dtype);
        case EK::VAR: return vars[size_t(e.id)];
        case EK::ACC: return accs[size_t(e.id)];
        case EK::LOAD:
            return load_value(bufs[e.id], prog.buffers[size_t(e.id)].dtype, eval(*e.src[0]).i);
        case EK::CHECK: {
            Num n = eval(*e.src[0]);
            if (n.i >= 0 && n.i < e.bound) return n;
            if (!err[0]) { err[0] = e.id + 1; err[1] = n.i; }
            return Num{};
        }
        case EK::ALU: break;
        }
        Num a[3];
        for (size_t i = 0; i < e.src.size(); i++) a[i] = eval(*e.src[i]);
        return alu_eval(e.op, e.dtype, e.src[0]->dtype, a);
    }

    void exec(const std::vector<Stmt>& body, const std::vector<int64_t>& extents) {
        for (const Stmt& st : body) {
            known.clear();
            switch (st.kind) {
            case SK::LOOP:
                if (vars.size() <= size_t(st.id)) vars.resize(size_t(st.id) + 1);
                for (int64_t i = 0; i < extents[size_t(st.id)]; i++) {
                    vars[size_t(st.id)].i = i;
                    exec(st.body, extents);
                }
                break;
            case SK::ACC_INIT:
                if (accs.size() <= size_t(st.id)) accs.resize(size_t(st.id) + 1);
                accs[size_t(st.id)] = eval(*st.val);
                break;
            case SK::ACC_UPDATE: {
                Num& acc = accs[size_t(st.id)];
                if (fused_term(st)) {
                    double x = eval(*st.val->src[0]).f, y = eval(*st.val->src[1]).f;
                    acc.f = st.dtype == DType::FLOAT32
                                ? double(std::fma(float(x), float(y), float(acc.f)))
                                : std::fma(x, y, acc.f);
                    break;
                }
                Num v[2] = {acc, eval(*st.val)};
                Op op = st.op == Op::REDUCE_SUM ? Op::ADD : Op::MAX;
                accs[size_t(st.id)] = alu_eval(op, st.dtype, st.dtype, v);
                break;
            }
            case SK::STORE:
            case SK::STORE_ADD: {
                DType dt = prog.buffers[size_t(st.id)].dtype;
                int64_t i = eval(*st.idx).i;
                Num v = eval(*st.val);
                if (st.kind == SK::STORE_ADD) {
                    Num both[2] = {load_value(bufs[st.id], dt, i), v};
                    v = alu_eval(st.op == Op::REDUCE_SUM ? Op::ADD : Op::MAX, dt, dt, both);
                }
                store_value(bufs[st.id], dt, i, v);
                break;
            }
            case SK::CHECK: eval(*st.idx); break;
            }
        }
    }

    void run(void* const* buffers, int64_t* error) override {
        bufs = buffers;
        err = error;
        for (const Block& b : prog.blocks) {
            if (b.writes_in_place && err[0]) return;
            exec(b.body, b.extents);
            if (b.finite_site >= 0 && !all_finite(b)) return;
        }
    }

    // TG_CHECK: err[1] = 2·index + 1 for an infinity, 2·index for a NaN (as the C helpers)
    bool all_finite(const Block& b) {
        DType dt = prog.buffers[size_t(b.finite_buffer)].dtype;
        for (int64_t i = 0; i < b.finite_count; i++) {
            double v = load_value(bufs[b.finite_buffer], dt, i).f;
            if (std::isfinite(v)) continue;
            if (!err[0]) { err[0] = b.finite_site + 1; err[1] = 2 * i + !std::isnan(v); }
            return false;
        }
        return true;
    }
};

TG_COLD_BEGIN   // to the thread pool: the renderer and the compiler driver
// ---- [RENDER] loop IR → C source ------------------------------------------------------- >>render
// One C99 file per program: a helper prelude, one static function per block (named k0, k1, ...
// with its fused ops and user lines in a comment), and the entry point tg_program(buffers, err).
// Output is deterministic (no addresses, no counters), so the same program hashes the same in
// every process. Tests: tests/test_schedule.cpp (golden C for a tiny graph).

static const char* c_type(DType dt) {
    switch (dt) {
    case DType::BOOL: return "uint8_t";
    case DType::INT32: return "int32_t";
    case DType::INT64: return "int64_t";
    case DType::FLOAT32: return "float";
    case DType::FLOAT64: return "double";
    case DType::INDEX: return "int64_t";
    }
    return "?";
}

static std::string c_const(double v, DType dt) {
    std::string s;
    if (dtype_is_float(dt)) {
        if (std::isnan(v)) return std::signbit(v) ? "(-NAN)" : "NAN";   // as INTERP holds it
        if (std::isinf(v)) return v > 0 ? "INFINITY" : "(-INFINITY)";
        s = strf(dt == DType::FLOAT32 ? "%.9g" : "%.17g", v);
        if (s.find_first_of(".e") == std::string::npos) s += ".0";
        if (dt == DType::FLOAT32) s += "f";
    } else {
        int64_t i = saturate_int(DType::INT64, v);
        s = i == INT64_MIN ? "-9223372036854775807LL - 1" : strf("%lld", (long long)i);
        if (i != INT64_MIN && (i > INT32_MAX || i < -INT32_MAX)) s += "LL";
    }
    return v < 0 ? "(" + s + ")" : s;
}

// Expressions are DAGs: a value used twice in one statement (relu's x in x > 0 ? x : 0) is
// computed once into a local t0, t1, ... declared just before the statement.
static bool worth_a_name(const Expr* e) {
    return e->kind == EK::ALU && (e->dtype != DType::INDEX || e->op == Op::WHERE);
}

struct CExprs {
    std::unordered_map<const Expr*, std::string> names;
    int& next_tmp;
    const std::map<int, std::string>* buffer_names = nullptr;   // bufN unless named here

    std::string str(const ExprP& e) {
        auto named = names.find(e.get());
        if (named != names.end()) return named->second;
        switch (e->kind) {
        case EK::CONST: return c_const(e->num, e->dtype);
        case EK::VAR: return strf("i%d", e->id);
        case EK::ACC: return strf("acc%d", e->id);
        case EK::LOAD: {
            std::string buffer = strf("buf%d", e->id);
            if (buffer_names && buffer_names->count(e->id)) buffer = buffer_names->at(e->id);
            return buffer + "[" + str(e->src[0]) + "]";
        }
        case EK::CHECK:
            return strf("tg_check(%s, %lldLL, %d, err)", str(e->src[0]).c_str(),
                        (long long)e->bound, e->id);
        case EK::ALU: break;
        }
        if (e->op == Op::ADD && e->dtype != DType::BOOL)
            return "(" + unparen_sum(e->src[0], str(e->src[0])) + " + " + str(e->src[1]) + ")";
        std::string form = op_c_form(e->op);
        bool is_float = dtype_is_float(e->dtype), is_bool = e->dtype == DType::BOOL;
        // tensor integers wrap around: computed in the unsigned type ({t} int32_t: u{t} uint32_t)
        bool wraps = e->dtype == DType::INT32 || e->dtype == DType::INT64;
        if (e->op == Op::MAX && !is_float) form = is_bool ? "({0} | {1})" : "tg_imax({0}, {1})";
        if (e->op == Op::ADD && is_bool) form = "({0} | {1})";
        if (e->op == Op::MUL && is_bool) form = "({0} & {1})";
        if (e->op == Op::ADD && wraps) form = "(({t})((u{t}){0} + (u{t}){1}))";
        if (e->op == Op::MUL && wraps) form = "(({t})((u{t}){0} * (u{t}){1}))";
        if (e->op == Op::NEG && wraps) form = "(({t})(0u - (u{t}){0}))";
        if (e->op == Op::MOD && wraps) form = "tg_imod({0}, {1})";   // C traps at 0 and -1
        if (e->op == Op::DIV && wraps) form = "(({t})tg_idiv({0}, {1}))";
        if (e->op == Op::CAST && is_bool) form = "({0} != 0)";
        if (e->op == Op::CAST && wraps && dtype_is_float(e->src[0]->dtype))
            form = e->dtype == DType::INT32 ? "tg_f2i({0})" : "tg_f2l({0})";
        // value selects evaluate both sides (every load is in bounds), so a vectorizing
        // compiler blends instead of using masked loads. Index selects are masks too: GCC 12
        // at -O2 (its value ranges, with PRE) computed a wrong index from c ? 0 : i - 406
        // in a nest that read three pieces of a cat (tests/test_interp.cpp)
        if (e->op == Op::WHERE)
            form = e->dtype == DType::FLOAT32   ? "tg_wheref({0}, {1}, {2})"
                   : e->dtype == DType::FLOAT64 ? "tg_whered({0}, {1}, {2})"
                                                : "tg_wherei({0}, {1}, {2})";
        std::string out;
        for (size_t i = 0; i < form.size(); i++) {
            if (form[i] != '{') { out += form[i]; continue; }
            size_t close = form.find('}', i);
            std::string key = form.substr(i + 1, close - i - 1);
            if (key == "f") out += e->dtype == DType::FLOAT32 ? "f" : "";
            else if (key == "t") out += c_type(e->dtype);
            else out += str(e->src[size_t(key[0] - '0')]);
            i = close;
        }
        return out;
    }

    // variable var, wherever e reads it, written as `as`
    void name_var(const ExprP& e, int var, const std::string& as) {
        ExprSet seen;
        each_part(e, seen, [&](const ExprP& part) {
            if (part->kind == EK::VAR && part->id == var) names[part.get()] = as;
        });
    }

    // declarations of the shared parts of exprs, operands before their users
    std::string declare_shared(const std::vector<ExprP>& exprs, const std::string& pad) {
        std::unordered_map<const Expr*, int> uses;
        for (auto& e : exprs)
            if (e) count_uses(e.get(), uses);
        std::string out;
        ExprSet done;
        std::function<void(const ExprP&)> visit = [&](const ExprP& e) {
            if (!done.insert(e.get())) return;
            for (auto& s : e->src) visit(s);
            if (uses[e.get()] > 1 && worth_a_name(e.get())) {
                std::string name = strf("t%d", next_tmp++);
                out += pad + c_type(e->dtype) + " " + name + " = " + str(e) + ";\n";
                names[e.get()] = name;
            }
        };
        for (auto& e : exprs)
            if (e) visit(e);
        return out;
    }
};

// arrays: the local arrays declared at the top of each loop's body (by loop variable)
// chunked: the loop at depth 1 runs over [lo, hi), the function's arguments
static void c_stmts(const std::vector<Stmt>& body, const std::vector<int64_t>& extents,
                    const std::map<int, std::string>& arrays, int depth, int& next_tmp,
                    std::string& out, bool chunked = false) {
    std::string pad(size_t(depth) * 4, ' ');
    for (const Stmt& st : body) {
        if (st.kind == SK::LOOP) {
            if (chunked && depth == 1)
                out += strf("%sfor (int64_t i%d = lo; i%d < hi; i%d++) {\n", pad.c_str(), st.id,
                            st.id, st.id);
            else
                out += strf("%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", pad.c_str(), st.id,
                            st.id, (long long)extents[size_t(st.id)], st.id);
            auto declared = arrays.find(st.id);
            if (declared != arrays.end()) out += pad + "    " + declared->second;
            c_stmts(st.body, extents, arrays, depth + 1, next_tmp, out);
            out += pad + "}\n";
            continue;
        }
        CExprs cx{{}, next_tmp};
        out += cx.declare_shared({st.idx, st.val}, pad);
        switch (st.kind) {
        case SK::ACC_INIT:
            out += strf("%s%s acc%d = %s;\n", pad.c_str(), c_type(st.dtype), st.id,
                        cx.str(st.val).c_str());
            break;
        case SK::ACC_UPDATE: {
            std::string v = cx.str(st.val), a = strf("acc%d", st.id);
            if (st.op == Op::REDUCE_SUM && (st.dtype == DType::INT32 || st.dtype == DType::INT64))
                out += strf("%s%s = (%s)((u%s)%s + (u%s)%s);\n", pad.c_str(), a.c_str(),
                            c_type(st.dtype), c_type(st.dtype), a.c_str(), c_type(st.dtype),
                            v.c_str());
            else if (fused_term(st))
                out += strf("%s%s = fma%s(%s, %s, %s);\n", pad.c_str(), a.c_str(),
                            st.dtype == DType::FLOAT32 ? "f" : "", cx.str(st.val->src[0]).c_str(),
                            cx.str(st.val->src[1]).c_str(), a.c_str());
            else if (st.op == Op::REDUCE_SUM) out += pad + a + " += " + v + ";\n";
            else if (dtype_is_float(st.dtype))
                out += pad + a + " = tg_max" + (st.dtype == DType::FLOAT32 ? "f" : "") + "(" + a +
                       ", " + v + ");\n";
            else out += pad + a + " = tg_imax(" + a + ", " + v + ");\n";
            break;
        }
        case SK::STORE:
            out += strf("%sbuf%d[%s] = %s;\n", pad.c_str(), st.id, cx.str(st.idx).c_str(),
                        cx.str(st.val).c_str());
            break;
        case SK::STORE_ADD:
            if (st.op == Op::REDUCE_SUM) {
                out += strf("%sbuf%d[%s] += %s;\n", pad.c_str(), st.id, cx.str(st.idx).c_str(),
                            cx.str(st.val).c_str());
                break;
            }
            out += strf("%s{ int64_t at = %s; buf%d[at] = %s(buf%d[at], %s); }\n", pad.c_str(),
                        cx.str(st.idx).c_str(), st.id,
                        st.dtype == DType::FLOAT32   ? "tg_maxf"
                        : st.dtype == DType::FLOAT64 ? "tg_max"
                                                     : "tg_imax",
                        st.id, cx.str(st.val).c_str());
            break;
        case SK::CHECK: out += pad + "(void)" + cx.str(st.idx) + ";\n"; break;
        case SK::LOOP: break;
        }
    }
}

// Sibling sum trees: a run of units (a few statements each) that are one code but for the
// buffers they read and the accumulators and loop variables they set. An unrolled recurrence's
// weight gradient is such a run, a tree per step over that step's buffers (R1's LSTM: 96 trees
// in one product, 9.8 s of GCC -O3 as straight code), and a tiled product runs it as a loop
// over tables of their buffers: the same operations in the same order, so the same bits.
struct SiblingRun {
    size_t first = 0, width = 0, count = 0;   // units [first + width·s, + width), s < count
    std::vector<std::vector<int>> buffers;    // buffers[j][s]: sibling s's j-th buffer read
    std::vector<DType> buffer_types;
    std::vector<std::vector<int>> roots;      // roots[j][s]: sibling s's j-th sum read outside
    std::vector<std::vector<int>> inner;      // inner[j][s]: its j-th sum read only inside
};
static const size_t SIBLING_MIN_COUNT = 4;
// Whether b is a's code with a's buffers, and the accumulators and loop variables a's own
// statements set (bound), renamed the same way everywhere; first_buffers lists a's buffers in
// the order they are read.
struct SiblingRenaming {
    std::map<int, int> buffers, accs, vars;
    std::vector<int> first_buffers;
    std::vector<DType> buffer_types;
};
static bool same_sibling(const ExprP& a, const ExprP& b, SiblingRenaming& rn) {
    if (a->kind != b->kind || a->op != b->op || a->dtype != b->dtype || a->num != b->num ||
        a->bound != b->bound || a->src.size() != b->src.size())
        return false;
    // a buffer may be another everywhere; a variable or sum only where a's statements set it
    auto renamed = [&](const std::map<int, int>& names) {
        auto it = names.find(a->id);
        return it == names.end() ? a->id == b->id : it->second == b->id;
    };
    bool same = a->kind == EK::VAR ? renamed(rn.vars)
                : a->kind == EK::ACC ? renamed(rn.accs)
                : a->kind != EK::LOAD ? a->id == b->id
                : rn.buffers.emplace(a->id, b->id).first->second == b->id;
    if (a->kind == EK::LOAD && rn.first_buffers.size() < rn.buffers.size()) {
        rn.first_buffers.push_back(a->id);
        rn.buffer_types.push_back(a->dtype);
    }
    for (size_t i = 0; same && i < a->src.size(); i++)
        same = same_sibling(a->src[i], b->src[i], rn);
    return same;
}
static bool same_sibling(const Stmt* a, const Stmt* b, size_t n,
                         const std::vector<int64_t>& extents, SiblingRenaming& rn) {
    for (size_t i = 0; i < n; i++) {
        const Stmt &x = a[i], &y = b[i];
        if (x.kind != y.kind || x.op != y.op || x.dtype != y.dtype ||
            bool(x.idx) != bool(y.idx) || bool(x.val) != bool(y.val) ||
            x.body.size() != y.body.size())
            return false;
        if (x.kind == SK::LOOP &&
            (extents[size_t(x.id)] != extents[size_t(y.id)] || !rn.vars.emplace(x.id, y.id).second))
            return false;
        if (x.kind == SK::ACC_INIT && !rn.accs.emplace(x.id, y.id).second) return false;
        if (x.kind == SK::ACC_UPDATE) {
            auto it = rn.accs.find(x.id);
            if (it == rn.accs.end() ? x.id != y.id : it->second != y.id) return false;
        }
        if (x.kind == SK::STORE || x.kind == SK::STORE_ADD || x.kind == SK::CHECK) return false;
        if ((x.idx && !same_sibling(x.idx, y.idx, rn)) ||
            (x.val && !same_sibling(x.val, y.val, rn)) ||
            !same_sibling(x.body.data(), y.body.data(), x.body.size(), extents, rn))
            return false;
    }
    return true;
}
// The runs of SIBLING_MIN_COUNT or more siblings among the statements of body (a piece of a
// product's sum trees), left to right, each of the widest units that repeats. A sum that a
// unit sets and that is read outside it (by the epilogue, the statements around, or a later
// piece: `carried`) is a root, one for each sibling, and must be set at the unit's top; the
// others serve every sibling in turn.
static std::vector<SiblingRun> sibling_runs(const std::vector<Stmt>& body,
                                            const std::vector<int64_t>& extents,
                                            const std::vector<Stmt>& epilogue,
                                            const std::vector<int>& carried) {
    std::vector<SiblingRun> runs;
    for (size_t at = 0; at < body.size();) {
        SiblingRun best;
        for (size_t width = 1; width <= 8 && at + width * SIBLING_MIN_COUNT <= body.size();
             width++) {
            SiblingRun run{at, width, 1, {}, {}, {}, {}};
            SiblingRenaming own;   // the first unit named as itself
            if (!same_sibling(&body[at], &body[at], width, extents, own)) continue;
            std::vector<SiblingRenaming> renamings{own};
            for (size_t next = at + width; next + width <= body.size(); next += width) {
                SiblingRenaming rn;
                if (!same_sibling(&body[at], &body[next], width, extents, rn)) break;
                renamings.push_back(std::move(rn));
                run.count++;
            }
            const size_t end = at + width * run.count;
            if (run.count < SIBLING_MIN_COUNT || run.count * width <= best.count * best.width)
                continue;
            std::unordered_set<int> outside(carried.begin(), carried.end()), tops;
            accs_read(epilogue, outside);
            for (size_t i = 0; i < body.size(); i++)
                if (i < at || i >= end) accs_read(body[i], outside);
            for (size_t i = at; i < at + width; i++)
                if (body[i].kind == SK::ACC_INIT) tops.insert(body[i].id);
            bool apart = true;
            for (const auto& bound : own.accs) {
                std::vector<int> sums;
                bool read = false;
                for (const SiblingRenaming& rn : renamings) {
                    sums.push_back(rn.accs.at(bound.first));
                    read = read || outside.count(sums.back());
                }
                apart = apart && (!read || tops.count(bound.first));
                (read ? run.roots : run.inner).push_back(std::move(sums));
            }
            if (!apart) continue;
            for (size_t j = 0; j < own.first_buffers.size(); j++) {
                run.buffers.emplace_back();
                for (const SiblingRenaming& rn : renamings)
                    run.buffers.back().push_back(rn.buffers.at(own.first_buffers[j]));
            }
            run.buffer_types = own.buffer_types;
            best = std::move(run);
        }
        at = best.count >= SIBLING_MIN_COUNT ? at + best.width * best.count : at + 1;
        if (best.count >= SIBLING_MIN_COUNT) runs.push_back(std::move(best));
    }
    return runs;
}

// The function of a tiled product (pass_tile_products), for tasks [lo, hi). A task runs over
// a panel of columns and a block of rows, tile by tile: R rows × W columns of vector sums, the
// untiled sum trees with each accumulator an array of R × W/16 vectors. Each term multiplies
// one value of a row (x) by a vector of the columns' values (y). An operand that is a load is
// read where it lies (x's row clamped to the last one for a partial tile; y when it is read
// along the columns and no tile is partial); else it is packed: y for the panel (ys[c / W][n]
// [c % W] is term n of column col0 + c; packed once for a run of tasks of one panel where y
// reads no other output loop), x for the tile (xs[n][r]), in the order of the terms, rows and
// columns past the end as 0. The epilogue then runs for each element of the tile.
// Sums too long for a panel run in pieces (tree_pieces), each packed and summed over the row
// block in turn; the sums of the levels cut wait between them in carry arrays, and the
// epilogue runs over the block after the last piece.
static std::string c_tiled_product(const Block& b) {
    ProductMatch m;
    if (!match_product(b, m)) fail("render: a nest tiled as a product is no longer one");
    const Block::Tiles& t = b.tile;
    std::vector<TreePiece> pieces;
    std::vector<int> carried;
    if (t.piece_terms && !tree_pieces(m, b.extents, t.piece_terms, pieces, carried))
        fail("render: a product tiled in pieces can no longer be cut into them");
    bool in_pieces = !pieces.empty();
    if (!in_pieces) pieces.push_back(TreePiece{m.trees, 0, {}, m.terms});
    long long R = t.rows, W = t.cols, V = t.cols / TILE_LANES, NT = 0;   // NT: a panel's terms
    for (const TreePiece& piece : pieces) NT = std::max<long long>(NT, piece.terms);
    long long PC = t.panel_cols, RB = t.row_block, RBP = (RB + R - 1) / R * R;
    long long M = m.rows >= 0 ? b.extents[size_t(m.rows)] : 1, N = b.extents[size_t(m.cols)];
    long long panels = (N + PC - 1) / PC, blocks = (M + RB - 1) / RB;
    int rows = m.rows, cols = m.cols, next_tmp = 0;
    int chunked_loop = -1;   // the loop that runs over [k0, k1) in this piece
    // set while a panel is packed: emits a loop around one term whole, or declines (false)
    std::function<bool(const Stmt& loop, const std::string& pad)> whole_loop;
    const std::vector<Stmt> &trees = m.trees, &epilogue = m.epilogue;
    std::unordered_set<int> final_read;   // the sums the epilogue reads
    accs_read(epilogue, final_read);
    std::string out;
    // sibling sum trees run as loops (SiblingRun, found once for each piece): within one, its
    // first sibling's buffers are read through tables (sibs) and its sums are arrays over the
    // siblings, sum[sib]; outside, each sibling's sums are their elements (sibling_sums)
    std::vector<SiblingRun> runs;   // the piece's
    std::map<int, std::string> sibling_buffers, sibling_sums, sibling_loop_sums;
    std::map<std::vector<int>, std::string> tables;   // a table's buffers → its name
    std::string table_decls;
    auto sum_name = [&](int acc) {
        auto in_loop = sibling_loop_sums.find(acc);
        if (in_loop != sibling_loop_sums.end()) return in_loop->second;
        auto sibling = sibling_sums.find(acc);
        return sibling != sibling_sums.end() ? sibling->second : strf("sum%d", acc);
    };
    // an operand's C with the rows' or columns' variable written as `as`
    auto operand = [&](const ExprP& e, int var, const std::string& as) {
        CExprs cx{{}, next_tmp};
        cx.buffer_names = &sibling_buffers;
        cx.name_var(e, var, as);
        return cx.str(e);
    };
    bool x_direct = true, y_direct = N % W == 0, y_along = true;
    bool y_per_task = false;   // y reads an output loop's variable other than the columns'
    // the sum trees with each term (acc += x·y) replaced by term(), or as vector sums (top:
    // body is the piece's trees, where its sibling runs are)
    using Term = std::function<void(const ExprP& x, const ExprP& y, const std::string& pad)>;
    std::function<void(const std::vector<Stmt>&, int, const Term*, bool)> walk =
        [&](const std::vector<Stmt>& body, int depth, const Term* term, bool top) {
        std::string pad(size_t(depth) * 4, ' ');
        auto run = top ? runs.begin() : runs.end();
        for (size_t at = 0; at < body.size(); at++) {
            const Stmt& st = body[at];
            if (run != runs.end() && run->first == at) {
                for (size_t j = 0; j < run->buffers.size(); j++) {
                    std::string& table = tables[run->buffers[j]];
                    if (table.empty()) {
                        table = strf("sibs%zu", tables.size() - 1);
                        std::string list;
                        for (int buffer : run->buffers[j])
                            list += strf("%sbuf%d", list.empty() ? "" : ", ", buffer);
                        table_decls += strf("    const %s *const %s[%zu] = {%s};\n",
                                            c_type(run->buffer_types[j]), table.c_str(),
                                            run->count, list.c_str());
                    }
                    sibling_buffers[run->buffers[j][0]] = table + "[sib]";
                }
                for (const std::vector<int>& root : run->roots)
                    sibling_loop_sums[root[0]] = strf("sum%d[sib]", root[0]);
                out += strf("%sfor (int sib = 0; sib < %zu; sib++) {\n", pad.c_str(), run->count);
                std::vector<Stmt> first(body.begin() + long(at),
                                        body.begin() + long(at + run->width));
                walk(first, depth + 1, term, false);
                out += pad + "}\n";
                sibling_buffers.clear();
                sibling_loop_sums.clear();
                at += run->width * run->count - 1;
                ++run;
                continue;
            }
            if (st.kind == SK::LOOP) {
                if (term && whole_loop && st.body.size() == 1 && is_term(st.body[0]) &&
                    whole_loop(st, pad))
                    continue;
                if (st.id == chunked_loop)
                    out += strf("%sfor (int64_t i%d = k0; i%d < k1; i%d++) {\n", pad.c_str(),
                                st.id, st.id, st.id);
                else
                    out += strf("%sfor (int64_t i%d = 0; i%d < %lld; i%d++) {\n", pad.c_str(),
                                st.id, st.id, (long long)b.extents[size_t(st.id)], st.id);
                walk(st.body, depth + 1, term, false);
                out += pad + "}\n";
                continue;
            }
            bool a_term = is_term(st);
            ExprP xe, ye;
            int x_at = 0;
            if (a_term) split_term(st.val, rows, cols, xe, ye, x_at);
            const char* op = st.kind == SK::ACC_INIT ? "=" : "+=";
            if (term) {
                if (a_term) (*term)(xe, ye, pad);
                continue;
            }
            if (!a_term) {
                std::string v =
                    st.kind == SK::ACC_INIT ? "(tg_vf){0}" : sum_name(st.val->id) + "[r][v]";
                out += strf("%sTG_TILE(%lld, %lld) %s[r][v] %s %s;\n", pad.c_str(), R, V,
                            sum_name(st.id).c_str(), op, v.c_str());
                continue;
            }
            std::string yv = "TG_VEC(" + (y_direct ? "&" + operand(ye, cols, "c0") : "y") + ", v)";
            std::string sum = sum_name(st.id) + "[r][v]";   // its first term, or the next
            if (!xe) {   // a sum of columns
                out += strf("%sTG_TILE(%lld, %lld) %s %s %s;\n", pad.c_str(), R, V, sum.c_str(),
                            op, yv.c_str());
            } else if (rows < 0) {   // of products of columns
                std::string xv = "TG_VEC(&" + operand(xe, cols, "c0") + ", v)";
                std::string set = st.kind == SK::ACC_INIT
                                      ? xv + " * " + yv
                                      : "TG_FMAV(" + xv + ", " + yv + ", " + sum + ")";
                out += strf("%sTG_TILE(%lld, %lld) %s = %s;\n", pad.c_str(), R, V, sum.c_str(),
                            set.c_str());
            } else {
                std::string xv = x_direct ? operand(xe, rows, "row[r]") : "x[r]";
                std::string set = st.kind == SK::ACC_INIT
                                      ? sum + " = xr * yv[v]"
                                      : sum + " = TG_FMA(xr, yv[v], " + sum + ")";
                out += pad + "{\n";
                out += strf("%s    tg_vf yv[%lld];\n", pad.c_str(), V);
                out += strf("%s    for (int v = 0; v < %lld; v++) {\n", pad.c_str(), V);
                out += strf("%s        yv[v] = %s;\n", pad.c_str(), yv.c_str());
                out += pad + "        TG_IN_REGISTER(yv[v]);\n";
                out += pad + "    }\n";
                out += strf("%s    for (int r = 0; r < %lld; r++) {\n", pad.c_str(), R);
                out += strf("%s        float xr = %s;\n", pad.c_str(), xv.c_str());
                out += strf("%s        for (int v = 0; v < %lld; v++) %s;\n", pad.c_str(), V,
                            set.c_str());
                out += pad + "    }\n";
                out += pad + "}\n";
                if (!x_direct) out += strf("%sx += %lld;\n", pad.c_str(), R);
            }
            if (!y_direct) out += strf("%sy += %lld;\n", pad.c_str(), W);
        }
    };
    auto assign = [&](const std::string& pad, const std::string& to, const ExprP& v) {
        CExprs cx{{}, next_tmp};
        cx.buffer_names = &sibling_buffers;
        out += cx.declare_shared({v}, pad) + pad + to + " = " + cx.str(v) + ";\n";
    };
    bool products = false;
    Term probe = [&](const ExprP& x, const ExprP& y, const std::string&) {
        products = products || x;
        x_direct = x_direct && (!x || x->kind == EK::LOAD);
        y_along = y_along && y->kind == EK::LOAD && steps_by_one(y->src[0], cols);
        y_direct = y_direct && y_along;
        std::unordered_set<int> read;
        vars_used(y, read);
        for (int v : m.loops) y_per_task = y_per_task || (v != cols && read.count(v));
    };
    walk(trees, 0, &probe, false);
    out.clear();
    // A panel that is the same for every task of its columns (y reads no other output loop;
    // its terms in one piece) is packed once for them: the tasks take the panels last, so
    // that a chunk of them packs each of its panels once (a convolution's input gradient
    // packs the weight, one panel, for each of its 1,024 tasks: 15% of C1's step).
    const bool panel_once = !y_direct && !in_pieces && !y_per_task;

    out += strf("    /* a matrix product in tiles of %lld rows x %lld columns: %lld sums in\n"
                "       vector registers (%lld vectors of %lld floats a row) for each level of\n"
                "       a sum's tree */\n", R, W, R * V, V, (long long)TILE_LANES);
    if (in_pieces)
        out += strf("    /* its sums in %zu pieces of at most %lld terms, the row block's sums\n"
                    "       kept between them in carry arrays */\n", pieces.size(), NT);
    x_direct = x_direct || !products;
    if (!x_direct)
        out += strf("    float xs[%lld] __attribute__((aligned(64)));   /* a tile's rows */\n",
                    NT * R);
    if (!y_direct)
        out += strf("    float ys[%lld] __attribute__((aligned(64)));   /* a panel's columns */\n",
                    NT * PC);
    for (int acc : carried)
        out += strf("    float carry%d[%lld] __attribute__((aligned(64)));\n", acc, RBP * PC);
    const size_t tables_at = out.size();   // the sibling runs' tables go here, once found
    if (panel_once) out += "    int64_t packed_col0 = -1;   /* the panel in ys */\n";
    out += "    for (int64_t task = lo; task < hi; task++) {\n";
    out += blocks > 1 ? strf("        int64_t row0 = task %% %lld * %lld;\n", blocks, RB)
                      : "        int64_t row0 = 0;\n";
    long long below = blocks;   // the tasks one step of the next loop takes
    auto panel_of_task = [&] {
        std::string over = below > 1 ? strf("task / %lld", below) : "task";
        out += panels > 1 ? strf("        int64_t col0 = %s %% %lld * %lld;\n", over.c_str(),
                                 panels, PC)
                          : "        int64_t col0 = 0;\n";
        below *= panels;
    };
    if (!panel_once) panel_of_task();
    for (auto v = m.loops.rbegin(); v != m.loops.rend(); ++v) {
        if (*v == rows || *v == cols) continue;
        long long e = b.extents[size_t(*v)];
        out += strf("        int64_t i%d = task / %lld %% %lld;\n", *v, below, e);
        below *= e;
    }
    if (panel_once) panel_of_task();
    out += strf("        int64_t row_end = row0 + %lld < %lld ? row0 + %lld : %lld;\n", RB, M, RB,
                M);
    out += strf("        int64_t col_end = col0 + %lld < %lld ? col0 + %lld : %lld;\n", PC, N, PC,
                N);
    // a piece's code inside the task loop: the panel packed, then each tile's sums
    auto indented = [](const std::string& code) {
        std::string more;
        for (size_t at = 0, end; at < code.size(); at = end + 1) {
            end = code.find('\n', at);
            more += "    " + code.substr(at, end - at + 1);
        }
        return more;
    };
    std::function<std::string(const TreePiece&)> emit = [&](const TreePiece& piece) {
        const std::vector<Stmt>& part = piece.stmts;
        std::string before = std::move(out);
        out.clear();
        if (!piece.inner.empty()) {   // the loop, iteration by iteration, around its pieces
            std::string code;
            for (const TreePiece& inner : piece.inner) code += emit(inner);
            out = std::move(before);
            int v = part[0].id;
            return strf("        for (int64_t i%d = 0; i%d < %lld; i%d++) {\n", v, v,
                        (long long)b.extents[size_t(v)], v) + indented(code) + "        }\n";
        }
        long long NP = piece.terms;   // the terms this piece packs
        runs = sibling_runs(part, b.extents, epilogue, carried);
        sibling_sums.clear();
        for (const SiblingRun& run : runs)
            for (const std::vector<int>& root : run.roots)
                for (size_t s = 0; s < run.count; s++)
                    sibling_sums[root[s]] = strf("sum%d[%zu]", root[0], s);
        chunked_loop = piece.chunk ? part[0].id : -1;
        // the last panel's columns past the end are 0, stored term by term along each row of
        // it (W is a multiple of 16: the 16 columns packed at a time below lie in one panel)
        const size_t panel_at = out.size();
        if (!y_direct && NP && N % W) {
            out += strf("        if ((col_end - col0) %% %lld) {\n", W);
            out += strf("            float *pad = ys + (col_end - col0) / %lld * %lld;\n", W,
                        NT * W);
            out += strf("            for (int64_t n = 0; n < %lld; n++)\n", NP);
            out += strf("                for (int64_t c = (col_end - col0) %% %lld; c < %lld; c++) "
                        "pad[n * %lld + c] = 0;\n", W, W, W);
            out += "        }\n";
        }
        // the panel, 16 columns at a time for each term: the loads of a term's 16 columns and
        // the stores of 16 terms' columns each stay in a few cache lines, across or along them.
        // Where every y is read along the columns, a term's 16 are a memcpy of a size the C
        // compiler knows (moved as a vector), apart from the panel's last, shorter one: in a
        // loop they were a call of memcpy each (5-7% of W2's step). Read across the columns,
        // they stay a loop of a count the compiler does not know: knowing it, it unrolls 16
        // scalar moves, slower.
        if (!y_direct && NP) {
            out += "        for (int64_t cb = 0; cb < col_end - col0; cb += 16) {\n";
            out += strf("            float *to = ys + cb / %lld * %lld + cb %% %lld;\n", W,
                        NT * W, W);
            const char* count = "16";
            Term copy = [&](const ExprP&, const ExprP& y, const std::string& pad) {
                out += pad + "__builtin_memcpy(to, &" + operand(y, cols, "(col0 + cb)") + ", " +
                       count + " * sizeof(float));\n" + pad + strf("to += %lld;\n", W);
            };
            // A term that compares the column with constants (a convolution's window, padded
            // at both ends of each image row) is packed a loop per stretch of columns between
            // those edges, each with the comparisons decided: no select per element, so the
            // C compiler vectorizes it (as split_at_edges does for loops).
            std::vector<int64_t> pack_extents = b.extents;
            Term pack = [&](const ExprP&, const ExprP& y, const std::string& pad) {
                std::set<int64_t> edges =
                    edges_of({st_store(0, DType::FLOAT32, ix(0), y)}, cols, N);
                if (edges.empty() || edges.size() + 1 > SPLIT_MAX_PIECES) {
                    out += pad + "for (int64_t c = cb; c < ce; c++) {\n";
                    out += pad + strf("    int64_t i%d = col0 + c;\n", cols);
                    assign(pad + "    ", "to[c - cb]", y);
                    out += pad + "}\n" + pad + strf("to += %lld;\n", W);
                    return;
                }
                std::vector<int64_t> at{0};
                at.insert(at.end(), edges.begin(), edges.end());
                at.push_back(N);
                for (size_t k = 0; k + 1 < at.size(); k++) {
                    int var = int(pack_extents.size());
                    pack_extents.push_back(at[k + 1] - at[k]);
                    SimplifyMemo memo{&pack_extents, {}};
                    Rewritten done;
                    ExprP decided = simplify(substitute(y, [&](const ExprP& e) {
                        return e->kind == EK::VAR && e->id == cols
                                   ? ix_add(ex_var(var), ix(at[k])) : nullptr;
                    }, done), memo);
                    out += pad + strf("for (int64_t c = cb > %lld - col0 ? cb : %lld - col0, "
                                      "end = ce < %lld - col0 ? ce : %lld - col0; c < end; "
                                      "c++) {\n", (long long)at[k], (long long)at[k],
                                      (long long)at[k + 1], (long long)at[k + 1]);
                    out += pad + strf("    int64_t i%d = col0 + c", var) +
                           (at[k] ? strf(" - %lld", (long long)at[k]) : "") + ";\n";
                    assign(pad + "    ", "to[c - cb]", decided);
                    out += pad + "}\n";
                }
                out += pad + strf("to += %lld;\n", W);
            };
            if (y_along) {
                out += "            if (cb + 16 <= col_end - col0) {\n";
                walk(part, 4, &copy, true);
                out += "            } else {\n";
                count = "(col_end - col0 - cb)";
                walk(part, 4, &copy, true);
                out += "            }\n";
            } else {
                // read across the columns but along a term loop of 16 (a weight gradient's
                // columns, the output channels, are a plane apart; its terms run along a
                // row): 16 columns' 16 terms are copied into a block, which is stored
                // transposed (a panel of 4096 terms by 16 columns, timed by a program of our
                // own: a third to a half of the time of a move per element)
                size_t blocks_copied = 0;
                whole_loop = [&](const Stmt& loop, const std::string& pad) {
                    ExprP xe, ye;
                    int x_at = 0;
                    split_term(loop.body[0].val, rows, cols, xe, ye, x_at);
                    if (loop.id == chunked_loop || b.extents[size_t(loop.id)] != 16 ||
                        ye->kind != EK::LOAD || ye->dtype != DType::FLOAT32 ||
                        !steps_by_one(ye->src[0], loop.id))
                        return false;
                    out += pad + "{\n";
                    out += pad + "    float block[16][16] __attribute__((aligned(64)));\n";
                    out += pad + "    for (int64_t c = 0; c < 16; c++) {\n";
                    out += pad + strf("        const int64_t i%d = 0;\n", loop.id);
                    out += pad + "        __builtin_memcpy(block[c], &" +
                           operand(ye, cols, "(col0 + cb + c)") + ", 16 * sizeof(float));\n";
                    out += pad + "    }\n";
                    out += pad + "    for (int64_t n = 0; n < 16; n++)\n";
                    out += pad + strf("        for (int64_t c = 0; c < 16; c++) to[n * %lld + c] = "
                                      "block[c][n];\n", W);
                    out += pad + strf("    to += %lld;\n", 16 * W);
                    out += pad + "}\n";
                    blocks_copied++;
                    return true;
                };
                out += "            int64_t ce = cb + 16 < col_end - col0 ? cb + 16 : "
                       "col_end - col0;\n";
                const size_t full_at = out.size();
                walk(part, 4, &pack, true);
                whole_loop = nullptr;
                if (blocks_copied) {
                    out.insert(full_at, N % 16 ? "            if (ce - cb == 16) {\n"
                                               : "            {\n");
                    if (N % 16) {   // the last panel's last columns, term by term
                        out += "            } else {\n";
                        walk(part, 4, &pack, true);
                    }
                    out += "            }\n";
                } else {
                    out.resize(full_at);
                    walk(part, 3, &pack, true);
                }
            }
            out += "        }\n";
            if (panel_once)
                out = out.substr(0, panel_at) + "        if (col0 != packed_col0) {\n" +
                      indented(out.substr(panel_at)) +
                      "            packed_col0 = col0;\n        }\n";
        }
        out += strf("        for (int64_t r0 = row0; r0 < row_end; r0 += %lld) {\n", R);
        if (x_direct && rows >= 0) {
            out += strf("            int64_t row[%lld];\n", R);
            out += strf("            for (int r = 0; r < %lld; r++) row[r] = r0 + r < row_end ? "
                        "r0 + r : row_end - 1;\n", R);
        } else if (!x_direct && NP && M % R) {   // the last tile's rows past the end
            out += strf("            for (int64_t r = row_end - r0; r < %lld; r++)\n", R);
            out += strf("                for (int64_t n = 0; n < %lld; n++) xs[n * %lld + r] = "
                        "0;\n", NP, R);
        }
        if (!x_direct && NP) {   // the tile's rows for each term
            out += "            {\n                float *to = xs;\n";
            Term pack = [&](const ExprP& x, const ExprP&, const std::string& pad) {
                if (!x) return;
                out += pad + strf("for (int64_t r = 0; r < %lld && r0 + r < row_end; r++) {\n", R);
                out += pad + strf("    int64_t i%d = r0 + r;\n", rows);
                assign(pad + "    ", "to[r]", x);
                out += pad + "}\n" + pad + strf("to += %lld;\n", R);
            };
            walk(part, 4, &pack, true);
            out += "            }\n";
        }
        out += strf("            for (int64_t c0 = col0; c0 < col_end; c0 += %lld) {\n", W);
        if (!x_direct) out += "                const float *x = xs;\n";
        if (!y_direct)
            out += strf("                const float *y = ys + (c0 - col0) / %lld * %lld;\n", W,
                        NT * W);
        // the sums of this piece, and the carried ones that earlier pieces left
        std::unordered_set<int> set, touched, started;
        accs_set(part, set);
        accs_read(part, touched);
        touched.insert(set.begin(), set.end());
        for (const Stmt& st : part)
            if (st.kind == SK::ACC_INIT) started.insert(st.id);
        std::vector<int> loaded, stored;
        for (int acc : carried) {
            if (touched.count(acc) && !started.count(acc)) loaded.push_back(acc);
            if (set.count(acc)) stored.push_back(acc);
        }
        std::set<int> sums(set.begin(), set.end());
        sums.insert(loaded.begin(), loaded.end());
        // a run's sums: its first sibling's as arrays over the siblings, the others' none
        std::map<int, size_t> siblings;
        for (const SiblingRun& run : runs) {
            for (const std::vector<int>& root : run.roots)
                for (size_t s = 0; s < run.count; s++) siblings[root[s]] = s ? 0 : run.count;
            for (const std::vector<int>& inner : run.inner)
                for (size_t s = 1; s < run.count; s++) siblings[inner[s]] = 0;
        }
        for (int acc : sums) {
            auto sibling = siblings.find(acc);
            if (sibling == siblings.end())
                out += strf("                tg_vf sum%d[%lld][%lld];\n", acc, R, V);
            else if (sibling->second)
                out += strf("                tg_vf sum%d[%zu][%lld][%lld];\n", acc,
                            sibling->second, R, V);
        }
        auto tile_carry = [&](int acc) {   // the tile's row r in acc's carry array
            return strf("carry%d + (r0 - row0 + r) * %lld + (c0 - col0)", acc, PC);
        };
        for (int acc : loaded)
            out += strf("                TG_TILE(%lld, %lld) %s[r][v] = TG_VEC(%s, v);\n", R,
                        V, sum_name(acc).c_str(), tile_carry(acc).c_str());
        walk(part, 4, nullptr, true);
        for (int acc : stored)
            out += strf("                TG_TILE(%lld, %lld) *(tg_vf *)(%s + v * 16) = "
                        "%s[r][v];\n", R, V, tile_carry(acc).c_str(), sum_name(acc).c_str());
        if (!in_pieces) {   // the epilogue: loops of known bounds, which the C compiler vectorizes
            out += strf("                int64_t rn = row_end - r0 < %lld ? row_end - r0 : "
                        "%lld;\n", R, R);
            out += strf("                int64_t cn = col_end - c0 < %lld ? col_end - c0 : "
                        "%lld;\n", W, W);
            out += "                for (int64_t r = 0; r < rn; r++) {\n";
            if (rows >= 0) out += strf("                    int64_t i%d = r0 + r;\n", rows);
            out += "                    for (int64_t c = 0; c < cn; c++) {\n";
            out += strf("                        int64_t i%d = c0 + c;\n", cols);
            for (int acc : sums)
                if (final_read.count(acc))
                    out += strf("                        float acc%d = ((const float *)"
                                "%s[r])[c];\n", acc, sum_name(acc).c_str());
            c_stmts(epilogue, b.extents, {}, 6, next_tmp, out);
            out += "                    }\n                }\n";
        }
        out += "            }\n        }\n";
        if (piece.chunk) {   // the piece again for each chunk of its loop's iterations
            long long E = b.extents[size_t(chunked_loop)], C = piece.chunk;
            out = strf("        for (int64_t k0 = 0; k0 < %lld; k0 += %lld) {\n", E, C) +
                  strf("            int64_t k1 = k0 + %lld < %lld ? k0 + %lld : %lld;\n", C, E,
                       C, E) +
                  indented(out) + "        }\n";
        }
        std::string code = std::move(out);
        out = std::move(before);
        return code;
    };
    for (const TreePiece& piece : pieces) out += emit(piece);
    if (in_pieces) {   // the epilogue, each element's sums from the carry arrays
        out += "        for (int64_t r = row0; r < row_end; r++) {\n";
        if (rows >= 0) out += strf("            int64_t i%d = r;\n", rows);
        out += "            for (int64_t c = col0; c < col_end; c++) {\n";
        out += strf("                int64_t i%d = c;\n", cols);
        for (int acc : carried)
            if (final_read.count(acc))
                out += strf("                float acc%d = carry%d[(r - row0) * %lld + c - "
                            "col0];\n", acc, acc, PC);
        c_stmts(epilogue, b.extents, {}, 4, next_tmp, out);
        out += "            }\n        }\n";
    }
    out += "    }\n";
    return out.insert(tables_at, table_decls);
}

// TG_CHECK's scan of a float buffer: err[1] = 2·index + 1 for an infinity, 2·index for a NaN
// (x - x is NaN for both).
#define TG_FINITE_SOURCE(type, name)                                                           \
    "static int " #name "(const " #type " *x, int64_t n, int site, int64_t *err) {\n"           \
    "    for (int64_t i = 0; i < n; i++) {\n"                                                   \
    "        if (x[i] - x[i] == 0) continue;\n"                                                 \
    "        err[0] = site + 1;\n"                                                              \
    "        err[1] = 2 * i + (x[i] == x[i]);\n"                                                \
    "        return 1;\n"                                                                       \
    "    }\n"                                                                                   \
    "    return 0;\n"                                                                           \
    "}\n"

// Helpers a program may call; each is emitted only when the program uses it.
static const std::pair<const char*, const char*> C_HELPERS[] = {
    {"tg_imax(", "static inline int64_t tg_imax(int64_t a, int64_t b) { return a > b ? a : b; }\n"},
    {"tg_maxf(",
     "static inline float tg_maxf(float a, float b) { return a > b || a != a ? a : b; }\n"},
    {"tg_max(",
     "static inline double tg_max(double a, double b) { return a > b || a != a ? a : b; }\n"},
    {"tg_f2i(",
     "static inline int32_t tg_f2i(double x) {\n"
     "    return x != x ? 0 : x >= 2147483647.0 ? 2147483647\n"
     "         : x <= -2147483648.0 ? -2147483647 - 1 : (int32_t)x;\n"
     "}\n"},
    {"tg_f2l(",
     "static inline int64_t tg_f2l(double x) {\n"
     "    return x != x ? 0 : x >= 9223372036854775807.0 ? INT64_MAX\n"
     "         : x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x;\n"
     "}\n"},
    {"tg_check(",
     "static inline int64_t tg_check(int64_t i, int64_t n, int site, int64_t *err) {\n"
     "    if (i >= 0 && i < n) return i;\n"
     "    if (!err[0]) { err[0] = site + 1; err[1] = i; }\n"
     "    return 0;\n"
     "}\n"},
    {"tg_rand(", TG_STRINGIFY(TG_RAND_SOURCE) "\n"},
    {"tg_exp2f(", TG_STRINGIFY(TG_EXP2F_SOURCE) "\n"},
    {"tg_log2f(", TG_STRINGIFY(TG_LOG2F_SOURCE) "\n"},
    {"tg_exp2(", "static inline double tg_exp2(double x) { return exp2(x); }\n"},
    {"tg_log2(", "static inline double tg_log2(double x) { return log2(x); }\n"},
    {"tg_finitef(", TG_FINITE_SOURCE(float, tg_finitef)},
    {"tg_finite(", TG_FINITE_SOURCE(double, tg_finite)},
    // selects by bit masks, not by c ? a : b: GCC 12 at -O3 if-converts conditional
    // expressions into masked vector code that computes wrong values in some nests (two
    // selects on one condition in a loop of 7 or 14 iterations; tests/test_interp.cpp)
    // a tiled product's vectors of 16 floats (pass_tile_products), and its loop over a tile
    {"tg_vf sum",
     "typedef float tg_vf __attribute__((vector_size(64), may_alias));\n"
     "typedef float tg_vf_unaligned __attribute__((vector_size(64), may_alias, aligned(4)));\n"
     "#define TG_VEC(p, v) (((const tg_vf_unaligned *)(p))[v])\n"
     "#define TG_TILE(rows, vectors) \\\n"
     "    for (int r = 0; r < rows; r++) for (int v = 0; v < vectors; v++)\n"
     // without it GCC reads each vector of y again for every row, as a memory operand of the
     // FMA: the loads, not the FMAs, then set the pace (a 1024x128x512 product on one core:
     // 87 against 110 GFLOP/s)
     "#if defined(__AVX512F__)\n"
     "#define TG_IN_REGISTER(v) __asm__(\"\" : \"+v\"(v))\n"
     "#else\n"
     "#define TG_IN_REGISTER(v) (void)(v)\n"
     "#endif\n"},
    // x·y + s for a float x and vectors y, s, rounded once in each lane: the instruction where
    // the target has one (the lanes' fmaf otherwise, slower, with the same bits). Compiler
    // builtins, not <immintrin.h>: parsing that header took 0.17 s of every compile.
    {"TG_FMA(",
     "#if defined(__AVX512F__)\n"
     "#define TG_FMA(x, y, s) ((tg_vf)__builtin_ia32_vfmaddps512_mask( \\\n"
     "    (x) - (tg_vf){0}, (y), (s), (unsigned short)0xFFFF, 4))\n"
     "#elif defined(__FMA__)\n"
     "typedef float tg_v8 __attribute__((vector_size(32)));\n"
     "static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {\n"
     "    union { tg_vf v; tg_v8 h[2]; } a = {y}, b = {s};\n"
     "    for (int i = 0; i < 2; i++)\n"
     "        b.h[i] = __builtin_ia32_vfmaddps256(x - (tg_v8){0}, a.h[i], b.h[i]);\n"
     "    return b.v;\n"
     "}\n"
     "#elif defined(__aarch64__)\n"
     "#include <arm_neon.h>\n"
     "static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {\n"
     "    union { tg_vf v; float32x4_t q[4]; } a = {y}, b = {s};\n"
     "    for (int i = 0; i < 4; i++) b.q[i] = vfmaq_n_f32(b.q[i], a.q[i], x);\n"
     "    return b.v;\n"
     "}\n"
     "#else\n"
     "static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {\n"
     "    for (int l = 0; l < 16; l++) s[l] = fmaf(x, y[l], s[l]);\n"
     "    return s;\n"
     "}\n"
     "#endif\n"},
    // x·y + s for vectors x, y, s (a sum of products of columns), rounded once in each lane
    {"TG_FMAV(",
     "#if defined(__AVX512F__)\n"
     "#define TG_FMAV(x, y, s) ((tg_vf)__builtin_ia32_vfmaddps512_mask( \\\n"
     "    (x), (y), (s), (unsigned short)0xFFFF, 4))\n"
     "#elif defined(__FMA__)\n"
     "static inline tg_vf TG_FMAV(tg_vf x, tg_vf y, tg_vf s) {\n"
     "    typedef float half __attribute__((vector_size(32)));\n"
     "    union { tg_vf v; half h[2]; } a = {x}, b = {y}, c = {s};\n"
     "    for (int i = 0; i < 2; i++)\n"
     "        c.h[i] = __builtin_ia32_vfmaddps256(a.h[i], b.h[i], c.h[i]);\n"
     "    return c.v;\n"
     "}\n"
     "#elif defined(__aarch64__)\n"
     "#include <arm_neon.h>\n"
     "static inline tg_vf TG_FMAV(tg_vf x, tg_vf y, tg_vf s) {\n"
     "    union { tg_vf v; float32x4_t q[4]; } a = {x}, b = {y}, c = {s};\n"
     "    for (int i = 0; i < 4; i++) c.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]);\n"
     "    return c.v;\n"
     "}\n"
     "#else\n"
     "static inline tg_vf TG_FMAV(tg_vf x, tg_vf y, tg_vf s) {\n"
     "    for (int l = 0; l < 16; l++) s[l] = fmaf(x[l], y[l], s[l]);\n"
     "    return s;\n"
     "}\n"
     "#endif\n"},
    {"tg_wheref(",
     "static inline float tg_wheref(int c, float a, float b) {\n"
     "    union { float f; uint32_t u; } x = {a}, y = {b};\n"
     "    uint32_t m = -(uint32_t)(c != 0);\n"
     "    x.u = (x.u & m) | (y.u & ~m);\n"
     "    return x.f;\n"
     "}\n"},
    {"tg_whered(",
     "static inline double tg_whered(int c, double a, double b) {\n"
     "    union { double f; uint64_t u; } x = {a}, y = {b};\n"
     "    uint64_t m = -(uint64_t)(c != 0);\n"
     "    x.u = (x.u & m) | (y.u & ~m);\n"
     "    return x.f;\n"
     "}\n"},
    {"tg_imod(",
     "static inline int64_t tg_imod(int64_t a, int64_t b) {\n"
     "    return b == 0 || b == -1 ? 0 : a % b;\n"
     "}\n"},
    {"tg_idiv(",   // as alu_eval: x / 0 = 0, MIN / -1 wraps
     "static inline int64_t tg_idiv(int64_t a, int64_t b) {\n"
     "    return b == 0 ? 0 : b == -1 ? (int64_t)(0u - (uint64_t)a) : a / b;\n"
     "}\n"},
    {"tg_wherei(",
     "static inline int64_t tg_wherei(int c, int64_t a, int64_t b) {\n"
     "    uint64_t m = -(uint64_t)(c != 0);\n"
     "    return (int64_t)(((uint64_t)a & m) | ((uint64_t)b & ~m));\n"
     "}\n"},
};

// The buffers nest b (block k of p, or a part of it) touches: the arrays declared in it, by
// the loop whose body declares them (-1: the function's), and the others, its parameters in
// buffer order, each with whether the nest writes it. Renderers of every device share it.
struct NestBuffers {
    std::map<int, std::string> arrays;
    std::vector<std::pair<int, bool>> params;   // buffer, written
};
static NestBuffers nest_buffers(const Program& p, size_t k, const Block& b) {
    BlockAccesses uses = block_accesses(b);
    NestBuffers out;
    for (size_t i = 0; i < p.buffers.size(); i++) {
        bool writes = uses.writes(int(i));
        if (!writes && !uses.reads(int(i))) continue;
        const ProgramBuffer& pb = p.buffers[i];
        if (pb.local_block == int(k))
            out.arrays[pb.local_loop] +=
                strf("%s buf%zu[%lld];\n", c_type(pb.dtype), i, (long long)pb.numel);
        else
            out.params.push_back({int(i), writes});
    }
    return out;
}

// The positive constant that every access in blocks of a buffer they are passed adds to its
// index (a recurrent layer's step reads its rows of a stacked buffer), a multiple of `multiple`:
// the kernel is passed the buffer from there on and its indices drop the constant
// (shift_indices), so that kernels of one code at other offsets share a function (R1's
// program: 125 functions of C, 37 so).
static std::map<int, int64_t> index_offsets(const std::vector<const Block*>& blocks,
                                            const std::vector<int>& passed, int64_t multiple) {
    std::map<int, int64_t> least;
    for (int buffer : passed) least[buffer] = INT64_MAX;
    for (const Block* b : blocks)
        for (const Access& a : block_accesses(*b).accesses) {
            auto offset = least.find(a.buffer);   // not a local array
            if (offset == least.end()) continue;
            Linear lin;
            lin.add(1, a.idx);
            offset->second = std::min(offset->second, lin.constant);
        }
    for (auto it = least.begin(); it != least.end();) {
        int64_t offset = it->second;
        bool shift = offset > 0 && offset < INT64_MAX && offset % multiple == 0;
        it = shift ? std::next(it) : least.erase(it);
    }
    return least;
}
static void shift_indices(Block& b, const std::map<int, int64_t>& offsets) {
    auto shifted = [&](int buffer, const ExprP& idx) {
        Linear lin;
        lin.add(1, idx);
        lin.constant -= offsets.at(buffer);
        return lin.build();
    };
    Rewritten done;
    Replace replace = [&](const ExprP& e) -> ExprP {
        if (e->kind != EK::LOAD || !offsets.count(e->id)) return nullptr;
        return ex_load(e->id, e->dtype, shifted(e->id, substitute(e->src[0], replace, done)));
    };
    std::function<void(std::vector<Stmt>&)> shift = [&](std::vector<Stmt>& body) {
        for (Stmt& st : body) {
            st.idx = substitute(st.idx, replace, done);
            st.val = substitute(st.val, replace, done);
            if ((st.kind == SK::STORE || st.kind == SK::STORE_ADD) && offsets.count(st.id))
                st.idx = shifted(st.id, st.idx);
            shift(st.body);
        }
    };
    shift(b.body);
}

// The buffers a kernel's C names (bufN) in the order they first appear, and its C with them
// numbered in that order: kernels that run the same code over other buffers (a model's
// layers, a recurrent layer's steps) read the same, their parameters listed in that order.
struct RenumberedBuffers {
    std::vector<int> order;
    std::string c;
};
static RenumberedBuffers renumber_buffers(const std::string& c) {
    auto identifier = [](char ch) { return std::isalnum((unsigned char)ch) || ch == '_'; };
    RenumberedBuffers out;
    std::map<int, size_t> rank;
    for (size_t i = 0; i < c.size();) {
        size_t end = i + 3;
        while (end < c.size() && std::isdigit((unsigned char)c[end])) end++;
        bool buffer = c.compare(i, 3, "buf") == 0 && end > i + 3 &&
                      (i == 0 || !identifier(c[i - 1])) && (end == c.size() || !identifier(c[end]));
        if (!buffer) {
            out.c += c[i++];
            continue;
        }
        auto [it, first] = rank.emplace(std::stoi(c.substr(i + 3, end - i - 3)), rank.size());
        if (first) out.order.push_back(it->first);
        out.c += strf("buf%zu", it->second);
        i = end;
    }
    return out;
}

// Parameters (buffer, written) in the order the code first names their buffers: the order in
// which kernels of the same code (renumbered) pass them to their shared function.
static void order_by_first_use(std::vector<std::pair<int, bool>>& params,
                               const std::string& code) {
    std::vector<int> appear = renumber_buffers(code).order;
    auto first = [&](int i) { return std::find(appear.begin(), appear.end(), i) - appear.begin(); };
    std::stable_sort(params.begin(), params.end(),
                     [&](const auto& x, const auto& y) { return first(x.first) < first(y.first); });
}

// The C of a program as one file (the file TG_DEBUG keeps and tests read) or, where its kernels
// have split_from characters or more, two: the first nests, about half of the text, go into a
// file of their own with hidden rather than static functions, declared in the second, so that
// two compiler processes build it at once.
// A kernel whose code (with its buffers renumbered, and passed from their offsets:
// index_offsets) an earlier one has calls that one's function with its own buffers: the
// compiler reads each code once (R1's 2-layer LSTM over 32 steps, forward and backward: 279
// kernels, 37 functions).
static std::vector<std::string> render_c_files(const Program& p, size_t split_from) {
    const char LINKAGE = '\x01';   // "static " in the one file, hidden when split
    const char NAME = '\x02';      // the kernel's function name, until its code is compared
    std::vector<std::string> kernels(p.blocks.size()), prototypes(p.blocks.size());
    std::map<std::string, size_t> first_with_code;
    std::string calls;
    for (size_t k = 0; k < p.blocks.size(); k++) {
        std::string params, args, body, &out = kernels[k];
        NestBuffers buffers = nest_buffers(p, k, p.blocks[k]);
        std::vector<int> passed;
        for (auto [buffer, writes] : buffers.params) passed.push_back(buffer);
        std::map<int, int64_t> offsets = index_offsets({&p.blocks[k]}, passed, 1);
        Block shifted;
        if (!offsets.empty()) shift_indices(shifted = p.blocks[k], offsets);
        const Block& b = offsets.empty() ? p.blocks[k] : shifted;
        std::map<int, std::string>& arrays = buffers.arrays;
        bool chunked = b.parallel_chunks > 0, tiled = b.tile.rows > 0;
        int next_tmp = 0;
        if (arrays.count(-1)) body += "    " + arrays[-1];
        if (tiled) body += c_tiled_product(b);
        else c_stmts(b.body, b.extents, arrays, 1, next_tmp, body, chunked);
        order_by_first_use(buffers.params, body);
        for (auto [i, writes] : buffers.params) {
            const char* constness = writes ? "" : "const ";
            const char* type = c_type(p.buffers[size_t(i)].dtype);
            params +=
                strf("%s%s%s *restrict buf%d", params.empty() ? "" : ", ", constness, type, i);
            args += strf("%s(%s%s *)b[%d]", args.empty() ? "" : ", ", constness, type, i);
            if (offsets.count(i)) args += strf(" + %lldLL", (long long)offsets[i]);
        }
        if (block_accesses(b).checks) { params += ", int64_t *err"; args += ", err"; }
        std::string inline_args = args + strf(", 0, %lldLL", (long long)b.tile.tasks);
        if (chunked || tiled) {
            params += ", int64_t lo, int64_t hi";
            args += ", lo, hi";
        }
        // not inlined into tg_program: GCC 12 at -O3 with AVX-512 then lets one kernel's
        // restrict pointers reorder another's accesses to the same buffer (tests/test_interp.cpp)
        std::string code = strf("%c__attribute__((noinline)) void %c(%s) {\n", LINKAGE, NAME,
                                params.c_str()) + body + "}\n";
        const size_t runs = first_with_code.emplace(renumber_buffers(code).c, k).first->second;
        const std::string fn = strf("k%zu", runs);
        out += "\n/* " + b.title + (b.origin.empty() ? "" : "\n   from " + b.origin) +
               (runs == k ? "" : "\n   runs " + fn + "'s code") + " */\n";
        if (runs == k) {
            out += code.replace(code.find(NAME), 1, fn);
            prototypes[k] = strf("void %s(%s);\n", fn.c_str(), params.c_str());
        }
        if (b.writes_in_place && !p.checks.empty()) calls += "    if (err[0]) return;\n";
        if (chunked) {   // the entry the thread pool calls for each chunk
            out += strf("%cvoid k%zu_chunk(void *const *b, int64_t *err, int64_t lo, "
                        "int64_t hi) {\n    (void)err;\n    %s(%s);\n}\n",
                        LINKAGE, k, fn.c_str(), args.c_str());
            prototypes[k] +=
                strf("void k%zu_chunk(void *const *b, int64_t *err, int64_t lo, int64_t hi);\n", k);
            int64_t items = tiled ? b.tile.tasks : b.extents[size_t(b.body[0].id)];
            calls += strf("    run_chunks(k%zu_chunk, b, err, %lldLL, %lldLL);\n", k,
                          (long long)items, (long long)b.parallel_chunks);
        } else {
            calls += strf("    %s(%s);\n", fn.c_str(), (tiled ? inline_args : args).c_str());
        }
        if (b.finite_site >= 0) {
            DType dt = p.buffers[size_t(b.finite_buffer)].dtype;
            calls += strf("    if (tg_finite%s((const %s *)b[%d], %lldLL, %d, err)) return;\n",
                          dt == DType::FLOAT32 ? "f" : "", c_type(dt), b.finite_buffer,
                          (long long)b.finite_count, b.finite_site);
        }
    }
    std::string entry =
        "\nvoid tg_program(void *const *b, int64_t *err, tg_run_chunks run_chunks) {\n"
        "    (void)b; (void)err; (void)run_chunks;\n" + calls + "}\n";
    // run_chunks(f, b, err, n, chunks) calls f(b, err_c, lo, hi) for chunks of [0, n), maybe
    // on several threads, each with its own err_c, and keeps the first chunk's error
    auto file = [](std::string body) {
        std::string prelude =
            "/* generated by tinygrad.hpp */\n#include <math.h>\n#include <stdint.h>\n"
            "typedef void (*tg_chunk)(void *const *b, int64_t *err, int64_t lo, int64_t hi);\n"
            "typedef void (*tg_run_chunks)(tg_chunk f, void *const *b, int64_t *err, int64_t n,\n"
            "                              int64_t chunks);\n";
        for (auto& [name, code] : C_HELPERS)
            if (body.find(name) != std::string::npos) prelude += code;
        return prelude + body;
    };
    auto linked = [&](size_t from, size_t to, const char* linkage) {
        std::string out;
        for (size_t k = from; k < to; k++) {
            const std::string& kernel = kernels[k];
            size_t done = 0;
            for (size_t at; (at = kernel.find(LINKAGE, done)) != std::string::npos; done = at + 1)
                out.append(kernel, done, at - done).append(linkage);
            out.append(kernel, done);
        }
        return out;
    };
    size_t n = kernels.size(), half = 0, total = 0, first = 0;
    for (const std::string& k : kernels) total += k.size();
    if (n < 2 || total < split_from) return {file(linked(0, n, "static ") + entry)};
    while (half + 1 < n && first + kernels[half].size() <= total / 2)
        first += kernels[half++].size();
    half = std::max<size_t>(half, 1);
    const char* hidden = "__attribute__((visibility(\"hidden\"))) ";
    std::string declared = "\n";
    for (size_t k = 0; k < half; k++) declared += hidden + prototypes[k];
    return {file(linked(0, half, hidden)), file(declared + linked(half, n, "static ") + entry)};
}
static std::string render_c(const Program& p) { return render_c_files(p, SIZE_MAX)[0]; }

// ---- [RUNTIME] compiler, disk cache, dlopen, devices ---------------------------------- >>runtime
// compile_c: hash(source, compiler, flags, the toolchain's identity) names the cache entry. A hit
// in this process's table costs nothing; a valid file on disk (its size and hash match its .sum,
// and it is the user's own) is dlopened; otherwise the compiler runs once, writing to temporary
// names that are renamed into place, so processes compiling the same program at once all succeed.
// The .c stays beside the .so so a failed or surprising build can be read. A program of little work
// is built twice: quickly for its first runs, then optimized in the background (CompiledProgram),
// which takes W2's first step in a new process with an empty cache (W6) from about 0.9 to 0.4 s
// (bench/HISTORY.md). Devices CPU and INTERP keep data in host memory.
// Tests: tests/test_runtime.cpp.

using ChunkFn = void (*)(void* const*, int64_t*, int64_t, int64_t);
using RunChunksFn = void (*)(ChunkFn, void* const*, int64_t*, int64_t, int64_t);
using ProgramFn = void (*)(void* const*, int64_t*, RunChunksFn);
static std::mutex runtime_mutex;
static Stats global_stats;

static std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

static std::string so_checksum(const std::string& bytes) {
    return strf("%zu %s\n", bytes.size(), hex16(fnv1a64(bytes)).c_str());
}

// The cache entry must be the user's own and not writable by others before it is loaded.
static bool private_file(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 022);
}

// Compiler processes of background builds, each the leader of its own process group, so that
// a process leaving while one runs stops it with its children (cc1, as, ld) rather than leave
// them writing into the cache after it.
static std::mutex background_compilers_mutex;
static std::set<pid_t> background_compilers;
static std::atomic<bool> background_stopping{false};
static thread_local bool in_background_build = false;

// Runs a compiler command with its messages (stderr) going to errs, then read. A command with
// an environment (env: a job's made on another thread, see CompileJob) gets that one, not the
// process's, which another thread may change meanwhile (setenv); a background build's
// compiler is the leader of a process group that a process leaving stops.
static int run_compiler(const std::string& cmd, const std::string& errs, std::string& messages,
                        const std::vector<std::string>& env) {
    std::string line = cmd + " 2>" + shell_quote(errs);
    int status = -1;
    if (env.empty()) {
        status = std::system(line.c_str());
    } else {
        bool stoppable = in_background_build;
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        if (stoppable) {
            posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
            posix_spawnattr_setpgroup(&attr, 0);
        }
        const char* argv[] = {"sh", "-c", line.c_str(), nullptr};
        std::vector<const char*> envp;
        for (const std::string& e : env) envp.push_back(e.c_str());
        envp.push_back(nullptr);
        pid_t pid;
        // under the lock, so a process leaving either sees this compiler or stops it starting
        std::unique_lock<std::mutex> lock(background_compilers_mutex, std::defer_lock);
        if (stoppable) lock.lock();
        if (!(stoppable && background_stopping) &&
            posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv),
                        const_cast<char* const*>(envp.data())) == 0) {
            if (stoppable) {
                background_compilers.insert(pid);
                lock.unlock();
            }
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            if (stoppable) {
                lock.lock();
                background_compilers.erase(pid);
            }
        }
        posix_spawnattr_destroy(&attr);
    }
    read_file(errs, messages);
    std::remove(errs.c_str());
    return status;
}

// What cmd writes on stdout and stderr, run as run_compiler runs it (a file in dir holds it).
static std::string command_output(const std::string& cmd, const std::string& dir,
                                  const std::vector<std::string>& env) {
    static std::atomic<int> asked{0};
    std::string out = strf("%s/question.%d.%d", dir.c_str(), int(getpid()), asked++), answer,
                messages;
    run_compiler(cmd + " >" + shell_quote(out), out + ".err", messages, env);
    read_file(out, answer);
    std::remove(out.c_str());
    return answer + messages;
}

// A file by its path, size, inode and modification time (a file rebuilt in its place differs);
// empty where it cannot be read.
static std::string file_identity(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return "";
    return strf("%s %lld bytes, inode %llu, modified %lld.%09ld", path.c_str(),
                (long long)st.st_size, (unsigned long long)st.st_ino,
                (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
}
static std::string compiler_file(const std::string& cc, const std::string& path_variable) {
    if (cc.empty() || cc.find_first_of(" \t'\"\\$") != std::string::npos) return "";
    std::string path;
    if (cc.find('/') != std::string::npos) {
        path = cc;
    } else {
        std::istringstream dirs(path_variable);
        for (std::string dir; path.empty() && std::getline(dirs, dir, ':');) {
            std::string candidate = (dir.empty() ? "." : dir) + "/" + cc;
            if (access(candidate.c_str(), X_OK) == 0) path = candidate;
        }
    }
    char* resolved = path.empty() ? nullptr : realpath(path.c_str(), nullptr);
    if (!resolved) return "";
    std::string out = file_identity(resolved);
    std::free(resolved);
    return out.empty() ? out : out + "\n";
}
static std::string cpu_identity() {
    std::string info, out;
    if (!read_file("/proc/cpuinfo", info)) return "";
    std::istringstream lines(info);
    bool model = false, features = false;   // the first CPU's (x86's flags, ARM's Features)
    for (std::string line; std::getline(lines, line) && !(model && features);) {
        bool is_model = line.rfind("model name", 0) == 0;
        bool is_features = line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0;
        if ((is_model && !model) || (is_features && !features)) out += line + "\n";
        model = model || is_model;
        features = features || is_features;
    }
    return out;
}
// What a compiled program depends on besides its source and flags: the compiler's file and
// the macros the flags predefine (the compiler's version, the instruction sets that
// -march=native resolved to, the tuning). It joins every cache key, so an upgraded compiler or
// another machine sharing the cache builds anew. Asked once per process, without running the
// compiler where it can: the file that the compiler's name finds on PATH is known by its
// path, size, inode and modification time (as ccache checks a compiler), where `cc --version`
// would start two processes (about 10 ms, a third of a warm first step). A command with
// arguments (TG_CC="ccache gcc") or a name not found is asked its --version. The macros
// (about 15 ms: the preprocessor resolves -march=native) are kept in the cache directory
// under a key of the compiler, the flags, its identity and the CPU (/proc/cpuinfo's model and
// flags), so a process that finds them runs no preprocessor. A compiler that fails here
// fails again, with its message, when it compiles. The questions run as the compiles do
// (run_compiler), with the job's environment where it has one.
// Null where that would run the compiler and may_ask is false.
static const std::string* toolchain_identity(const std::string& cc, const std::string& flags,
                                             const std::string& dir,
                                             const std::vector<std::string>& env, bool may_ask) {
    static std::mutex asking;   // not runtime_mutex: programs go on running meanwhile
    static std::map<std::string, std::string> known;
    std::lock_guard<std::mutex> lock(asking);
    std::string& id = known[cc + '\0' + flags];
    if (!id.empty()) return &id;
    std::string path_variable;   // PATH, from env where there is one
    if (env.empty()) path_variable = env_str("PATH", "");
    for (const std::string& e : env)
        if (e.rfind("PATH=", 0) == 0) path_variable = e.substr(5);
    std::string version = compiler_file(cc, path_variable), cpu = cpu_identity(), macros;
    if (version.empty() && !may_ask) return nullptr;
    if (version.empty()) version = command_output(cc + " --version", dir, env);
    std::string kept = dir + "/toolchain-" +
                       hex16(fnv1a64_joined({&cc, &flags, &version, &cpu})) +
                       ".macros";
    if (cpu.empty() || !read_file(kept, macros) || macros.empty() || !private_file(kept)) {
        if (!may_ask) return nullptr;
        macros = command_output(cc + " " + flags + " -E -dM -x c /dev/null", dir, env);
        if (!cpu.empty() && macros.find("#define") != std::string::npos)
            write_file_atomic(kept, macros);
    }
    id = version + macros;
    if (id.empty()) id = "?";
    return &id;
}

static std::vector<std::string> environment_now() {   // for a job compiled on another thread
    std::vector<std::string> out;
    for (char** e = ::environ; *e; e++) out.push_back(*e);
    return out;
}

// A compile: the C files (and their hash), the compiler, its flags, the cache directory and
// the flags the toolchain is asked with (read when the program was prepared), and the key that
// names the result there. A job made on one thread and compiled on another carries the
// environment it was made with.
struct CompileJob {
    std::vector<std::string> files;
    uint64_t source = 0;
    std::string cc, flags, dir, identity_flags, key;
    std::vector<std::string> environment;
};
static const char* const OPTIMIZED_CFLAGS = "-O3 -march=native";   // TG_CFLAGS replaces it
static const char* const QUICK_CFLAGS = "-O0 -march=native";
// What a loadable library needs, and -fno-math-errno (no kernel reads errno; so sqrt is an
// instruction that vectorizes, not a call) and -ffp-contract=off: a value computed again in
// another loop must equal the first bit for bit (max's gradient compares them), which a
// multiply-add fused in one loop and not in the other breaks.
static const char* const ALWAYS_CFLAGS = " -fPIC -fno-math-errno -ffp-contract=off";
// A program is linked with libm alone, not the C library and start files the compiler adds by
// default: the process that loads it has the C library already, and the linker read its
// symbols for each program (a small program's link took 44 ms so, 30 ms with these). Flags
// that instrument the code keep the default link, which adds their runtime's library.
static std::string link_libraries(const std::string& flags) {
    for (const char* instrumenting : {"-fsanitize", "-fprofile", "--coverage", "-fopenmp"})
        if (flags.find(instrumenting) != std::string::npos) return " -lm";
    return " -nostdlib -lm";
}

// The job's flags and key for an optimization (TG_CFLAGS or one of the two above). The
// toolchain's identity is asked with the optimized flags for both builds (the quick one
// differs only in its -O, which its key holds); the first job asks it (see toolchain_identity).
// False where that would run the compiler and may_ask is false.
static bool set_optimization(CompileJob& job, const std::string& optimization,
                             bool may_ask = true) {
    job.flags = optimization + ALWAYS_CFLAGS;
    const std::string* asked =
        toolchain_identity(job.cc, job.identity_flags, job.dir, job.environment, may_ask);
    if (!asked) return false;
    const std::string& identity = *asked;
    // GCC 12's SLP vectorizer drops the float rounding of (double)(float)x in short loops and
    // in loop tails (tests/test_interp.cpp); our loops are vectorized by its loop vectorizer.
    bool gcc = identity.find("#define __GNUC__") != std::string::npos &&
               identity.find("#define __clang__") == std::string::npos;
    if (gcc) job.flags += " -fno-tree-slp-vectorize";
    // With AVX-512VL (the mask registers for 128- and 256-bit vectors), GCC 12.2's loop
    // vectorizer stored zeros for 15 of the 25 elements of (a sum) / (|x| + 0.5), x the
    // identity compared i == j, in a loop after two sums (tests/test_interp.cpp; clang, and
    // GCC at -O2 or without VL, computed it right). Without VL its vectors use AVX2's compares:
    // W2-W5 ran as fast (bench, alternating). No later GCC was at hand, so every GCC gets it.
    if (gcc && identity.find("#define __AVX512VL__ ") != std::string::npos)
        job.flags += " -mno-avx512vl";
    std::string source = hex16(job.source);
    job.key = hex16(fnv1a64_joined({&source, &job.cc, &job.flags, &identity}));
    return true;
}
// A job for files, with what the environment says now (TG_CC, the cache) and the optimized
// build's flags (TG_CFLAGS or OPTIMIZED_CFLAGS); its flags and key are set_optimization's.
static CompileJob compile_job(std::vector<std::string> files, const std::string& optimized) {
    CompileJob job;
    job.files = std::move(files);
    job.cc = env_str("TG_CC", "cc");
    job.dir = cache_dir();
    job.identity_flags = optimized + ALWAYS_CFLAGS;
    job.source = FNV_START;   // of the files, each followed by '\0'
    for (const std::string& f : job.files) job.source = fnv1a64("", 1, fnv1a64(f, job.source));
    return job;
}

static std::unordered_map<std::string, ProgramFn>& loaded_programs() {   // by key
    static std::unordered_map<std::string, ProgramFn> table;
    return table;
}
static ProgramFn load_program(const std::string& so) {
    void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) fail("compile: cannot load " + so + ": " + dlerror());
    auto fn = reinterpret_cast<ProgramFn>(dlsym(handle, "tg_program"));
    if (!fn) fail("compile: " + so + " has no tg_program");
    return fn;
}

// The job's program from this process's table or a valid cache file; null if neither.
static ProgramFn find_compiled(const CompileJob& job) {
    std::lock_guard<std::mutex> lock(runtime_mutex);
    auto it = loaded_programs().find(job.key);
    if (it != loaded_programs().end()) {
        if (!in_background_build) global_stats.memory_cache_hits++;
        return it->second;
    }
    std::string so = job.dir + "/" + job.key + ".so", bytes, recorded;
    if (!read_file(so, bytes) || !read_file(job.dir + "/" + job.key + ".sum", recorded) ||
        recorded != so_checksum(bytes))
        return nullptr;
    if (!private_file(so))
        fail("compile: refusing to load " + so + ": it belongs to another user or others can "
             "write it; remove it (the cache directory itself is private)");
    if (!in_background_build) global_stats.disk_cache_hits++;
    return loaded_programs()[job.key] = load_program(so);
}

// Compiles the job's files, each in a compiler process of its own at once, links them, and
// loads the result. The compilers run without runtime_mutex: programs keep running meanwhile.
static ProgramFn run_compile(const CompileJob& job) {
    static std::atomic<int> builds{0};
    auto t0 = std::chrono::steady_clock::now();
    std::string base = job.dir + "/" + job.key, so = base + ".so", bytes;
    std::string tmp = strf("%s.tmp.%d.%d", so.c_str(), int(getpid()), builds++);
    const std::vector<std::string>& files = job.files;
    const std::string &cc = job.cc, &flags = job.flags;
    std::vector<std::string> paths, objects, cmds;
    for (size_t i = 0; i < files.size(); i++) {
        paths.push_back(files.size() == 1 ? base + ".c" : strf("%s.%zu.c", base.c_str(), i));
        write_file_atomic(paths[i], files[i]);
        if (files.size() > 1) objects.push_back(strf("%s.%zu.o", tmp.c_str(), i));
    }
    auto command = [&](size_t i, const std::string& more_flags) {
        std::string output = files.size() == 1 ? "-shared -o " + shell_quote(tmp)
                                               : "-c -o " + shell_quote(objects[i]);
        return cc + " " + flags + more_flags + " " + output + " " + shell_quote(paths[i]) +
               (files.size() == 1 ? link_libraries(flags) : "");
    };
    for (size_t i = 0; i < files.size(); i++) cmds.push_back(command(i, ""));
    std::vector<int> status(cmds.size());
    std::vector<std::string> messages(cmds.size());
    bool background = in_background_build;
    auto compile = [&](size_t i) {
        in_background_build = background;
        status[i] = run_compiler(cmds[i], strf("%s.%zu.err", tmp.c_str(), i), messages[i],
                                 job.environment);
        // A compiler that crashes gets the file again at -O1: slower code, the same bits (no
        // optimization changes a result here, see ALWAYS_CFLAGS). GCC 12.2's loop vectorizer
        // crashed on an argmax that repeat() spread over a second loop (tests/test_interp.cpp).
        if (status[i] == 0) return;
        bool crashed = messages[i].find("internal compiler error") != std::string::npos ||
                       messages[i].find("PLEASE submit a bug report") != std::string::npos;
        if (!crashed) return;
        std::fprintf(stderr, "[tg] the C compiler crashed on %s; it is built again with -O1: "
                             "slower code, the same results\n", paths[i].c_str());
        cmds[i] = command(i, " -O1");
        status[i] = run_compiler(cmds[i], strf("%s.%zu.err", tmp.c_str(), i), messages[i],
                                 job.environment);
    };
    std::vector<std::thread> others;   // the other files, each in a compiler of its own
    for (size_t i = 1; i < cmds.size(); i++) others.emplace_back(compile, i);
    compile(0);
    for (std::thread& t : others) t.join();
    bool compiled = std::all_of(status.begin(), status.end(), [](int x) { return x == 0; });
    if (!objects.empty() && compiled) {   // and linked
        std::string link = cc + " " + flags + " -shared -o " + shell_quote(tmp);
        for (const std::string& o : objects) link += " " + shell_quote(o);
        cmds.push_back(link + link_libraries(flags));
        paths.push_back(paths.back());
        messages.emplace_back();
        status.push_back(
            run_compiler(cmds.back(), tmp + ".link.err", messages.back(), job.environment));
    }
    for (const std::string& o : objects) std::remove(o.c_str());
    for (size_t i = 0; i < cmds.size(); i++) {
        if (status[i] == 0 && (i + 1 < cmds.size() || read_file(tmp, bytes))) continue;
        std::remove(tmp.c_str());
        int code = WIFEXITED(status[i]) ? WEXITSTATUS(status[i]) : -1;
        if (code == 127)
            fail("compile: C compiler '" + cc + "' not found (set TG_CC, or TG_DEVICE=INTERP)\n"
                 "command: " + cmds[i] + "\n" + messages[i] + "source kept at " + paths[i]);
        fail(strf("compile: the C compiler failed (exit status %d)\ncommand: %s\n%s"
                  "source kept at %s", code, cmds[i].c_str(), messages[i].c_str(),
                  paths[i].c_str()));
    }
    if (std::rename(tmp.c_str(), so.c_str()) != 0)
        fail("compile: cannot rename " + tmp + " to " + so);
    write_file_atomic(base + ".sum", so_checksum(bytes));
    std::lock_guard<std::mutex> lock(runtime_mutex);
    (background ? global_stats.background_compiles : global_stats.compiles)++;
    (background ? global_stats.background_compile_seconds : global_stats.compile_seconds) +=
        seconds_since(t0);
    return loaded_programs()[job.key] = load_program(so);
}

static ProgramFn compile_c(const CompileJob& job) {
    ProgramFn fn = find_compiled(job);
    return fn ? fn : run_compile(job);
}

TG_COLD_END
// The threads that run a program's parallel nests: created once, grown to TG_THREADS - 1
// (read at each run, default the machine's cores); the calling thread works too. One job at a
// time: a second program running meanwhile (another user thread) runs its chunks itself, and
// so does a child process after fork(), which has none of the parent's threads.
// Every worker answers every job (one that is not needed at once), so none can fall a job
// behind. Waiting spins for up to POOL_SPIN_US before it sleeps, as a program's parallel
// nests come microseconds apart: W5's step took 24.0-25.2 ms with threads that slept at once
// and 21.9-22.6 ms with spinning (bench/HISTORY.md).
static const int POOL_SPIN_US = 200;
static inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
// until done() or POOL_SPIN_US have passed; whether done()
template <typename F> static bool spin_until(F done) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0;; i++) {
        if (done()) return true;
        spin_pause();
        if (i % 64 == 63 && std::chrono::steady_clock::now() - start >
                                std::chrono::microseconds(POOL_SPIN_US))
            return done();
    }
}
class ThreadPool {
public:
    ~ThreadPool() {
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        wake_.notify_all();
        for (std::thread& t : workers_) t.join();
    }
    // task(0) .. task(count - 1), on up to `threads` threads
    void run(int64_t count, int threads, const std::function<void(int64_t)>& task) {
        std::unique_lock<std::mutex> job(job_, std::try_to_lock);
        int helpers = int(std::min<int64_t>(threads, count)) - 1;
        if (!job.owns_lock() || helpers <= 0 || this_process() != owner_) {
            for (int64_t c = 0; c < count; c++) task(c);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(m_);
            while (int(workers_.size()) < helpers) {   // each waits for the job after this
                int id = int(workers_.size());
                uint64_t now = generation_;
                workers_.emplace_back([this, id, now] { work(id, now); });
            }
            job_workers_ = int(workers_.size());
            task_ = &task;
            count_ = count;
            next_ = 0;
            helpers_ = helpers;
            answered_ = 0;
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        take_chunks();
        auto all_answered = [&] {
            return answered_.load(std::memory_order_acquire) == job_workers_;
        };
        if (!spin_until(all_answered)) {
            std::unique_lock<std::mutex> lock(m_);
            done_.wait(lock, all_answered);
        }
        task_ = nullptr;
    }

private:
    void take_chunks() {
        for (int64_t c; (c = next_.fetch_add(1)) < count_;) (*task_)(c);
    }
    void work(int id, uint64_t seen) {
        auto new_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
        for (;;) {
            if (!spin_until(new_job)) {
                std::unique_lock<std::mutex> lock(m_);
                wake_.wait(lock, [&] { return stop_ || new_job(); });
                if (stop_) return;
            }
            seen = generation_.load(std::memory_order_acquire);
            int workers = job_workers_;   // read before answering: the job's own until then
            if (id < helpers_) take_chunks();
            if (answered_.fetch_add(1, std::memory_order_acq_rel) + 1 == workers) {
                std::lock_guard<std::mutex> lock(m_);   // the caller waits or sees the count
                done_.notify_one();
            }
        }
    }
    std::mutex job_, m_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    const std::function<void(int64_t)>* task_ = nullptr;
    std::atomic<int64_t> next_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> answered_{0};
    int64_t count_ = 0;
    int helpers_ = 0, job_workers_ = 0;
    bool stop_ = false;
    pid_t owner_ = this_process();
};

// A device's queue on a thread of its own, started at first use. An error is thrown once, by
// the first wait after it. A child process after fork() has no such thread: there the work
// runs at once.
class ThreadQueue : public WorkQueue {
public:
    explicit ThreadQueue(Device* dev) : dev_(dev) {}
    uint64_t enqueue(std::function<void()> work) override {
        if (this_process() != owner_) {
            work();
            return 0;
        }
        std::lock_guard<std::mutex> lock(m_);
        if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
        work_.push_back(std::move(work));
        wake_.notify_one();
        return ++queued_;
    }
    uint64_t record() override {
        std::lock_guard<std::mutex> lock(m_);
        return queued_;
    }
    void wait(uint64_t event) override {
        std::unique_lock<std::mutex> lock(m_);
        ran_.wait(lock, [&] { return done_ >= event; });
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

private:
    void serve() {
        dev_->queue_thread_start();
        for (;;) {
            std::function<void()> work;
            bool failed;
            {
                std::unique_lock<std::mutex> lock(m_);
                wake_.wait(lock, [&] { return !work_.empty(); });
                work = std::move(work_.front());
                work_.erase(work_.begin());
                failed = error_ != nullptr;
            }
            std::exception_ptr error;
            if (!failed) try {
                    work();
                } catch (...) {
                    error = std::current_exception();
                }
            {
                std::lock_guard<std::mutex> lock(m_);
                if (error) error_ = error;
                done_++;
            }
            ran_.notify_all();
        }
    }
    Device* dev_;
    std::mutex m_;
    std::condition_variable wake_, ran_;
    std::vector<std::function<void()>> work_;
    uint64_t queued_ = 0, done_ = 0;
    std::exception_ptr error_;
    std::thread thread_;
    pid_t owner_ = this_process();
};

// The machine's cores, asked once: glibc reads /sys/devices/system/cpu/online at each
// hardware_concurrency() (an open, a read and a close), and an eager step asked at every run.
static int machine_cores() {
    static const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    return cores;
}
static int thread_count() { return env_int("TG_THREADS", machine_cores(), 1, 1024); }

// The pool and thread count of the programs this thread runs: a CPU:k device's queue thread
// uses that device's pool, and DataParallel gives each of N devices run at once threads()/N.
static thread_local ThreadPool* thread_pool_here = nullptr;
static thread_local int threads_here = 0;   // 0: thread_count()
struct ThreadsHere {
    int saved = threads_here;
    explicit ThreadsHere(int n) { threads_here = n; }
    ~ThreadsHere() { threads_here = saved; }
};

// Chunk c of [0, n) is [n·c/chunks, n·(c+1)/chunks). Each chunk reports a failed bounds check
// in its own err; the program gets the first chunk's, as a loop in order would have.
static void run_chunks(ChunkFn fn, void* const* b, int64_t* err, int64_t n, int64_t chunks) {
    static ThreadPool pool;
    std::vector<int64_t> errs(size_t(2 * chunks), 0);
    ThreadPool& here = thread_pool_here ? *thread_pool_here : pool;
    here.run(chunks, threads_here ? threads_here : thread_count(), [&](int64_t c) {
        fn(b, &errs[size_t(2 * c)], n * c / chunks, n * (c + 1) / chunks);
    });
    for (int64_t c = 0; c < chunks && !err[0]; c++)
        if (errs[size_t(2 * c)]) {
            err[0] = errs[size_t(2 * c)];
            err[1] = errs[size_t(2 * c + 1)];
        }
}

struct CompiledProgram;
// Optimized builds of quick-built programs, made one at a time on a thread of their own in the
// order asked for. A process that leaves while one runs kills its compiler processes (each
// a process group) and drops the rest; a forked child starts a thread of its own if it asks.
class BackgroundBuilds {
public:
    void add(std::weak_ptr<CompiledProgram> program, CompileJob job);
    void finish() {   // until none waits or runs
        std::unique_lock<std::mutex> lock(m_);
        if (this_process() == owner_) idle_.wait(lock, [&] { return jobs_.empty() && !busy_; });
    }
    ~BackgroundBuilds() {
        {
            std::lock_guard<std::mutex> lock(m_);
            stopping_ = true;
            jobs_.clear();
        }
        background_stopping = true;
        wake_.notify_all();
        if (!worker_ || this_process() != owner_) return;   // a forked child: not its thread
        {
            std::lock_guard<std::mutex> lock(background_compilers_mutex);
            for (pid_t pid : background_compilers) kill(-pid, SIGKILL);
        }
        worker_->join();
        delete worker_;
    }

private:
    struct Job {
        std::weak_ptr<CompiledProgram> program;
        CompileJob job;
    };
    std::mutex m_;
    std::condition_variable wake_, idle_;
    std::deque<Job> jobs_;
    bool busy_ = false, stopping_ = false;
    std::thread* worker_ = nullptr;
    pid_t owner_ = this_process();
    void work();
};
static BackgroundBuilds& background_builds() {
    static BackgroundBuilds builds;
    return builds;
}

// A compiled program. One of little work (Program::work) is built quickly first (QUICK_CFLAGS:
// the compiler takes about a fifth of the time, the code runs up to 20 times slower) and asks
// for its optimized build at its TG_QUICK_RUNS-th run (default 2, so what runs once, a
// model's initializers, is never built twice); the runs after that build is ready call it.
// Both builds compute the same bits: each operation in the C is the IEEE operation it names,
// with no contraction and no fast-math, at any optimization level (tests/test_oracle.cpp
// compares them on random graphs).
struct CompiledProgram : Executable, std::enable_shared_from_this<CompiledProgram> {
    std::atomic<ProgramFn> fn;
    std::optional<CompileJob> optimized;   // to ask for, while the quick build runs
    std::atomic<int> quick_runs_left{0};
    std::string name;
    bool announce = false;   // TG_DEBUG >= 1 when it was built: say when the optimized is ready
    explicit CompiledProgram(ProgramFn f) : fn(f) {}
    void run(void* const* buffers, int64_t* err) override {
        fn.load(std::memory_order_acquire)(buffers, err, run_chunks);
        if (quick_runs_left > 0 && quick_runs_left.fetch_sub(1) == 1) {
            background_builds().add(weak_from_this(), std::move(*optimized));
            optimized.reset();
        }
    }
};

// A program built at its first run, by the thread that runs it (Device::prepare_files). A
// build that fails fails that run; the next run builds again.
struct LaterExecutable : Executable {
    explicit LaterExecutable(std::function<std::shared_ptr<Executable>()> b) : make(std::move(b)) {}
    bool needs_build() override {
        std::lock_guard<std::mutex> lock(building);
        return !built;
    }
    void build() override { built_now(); }
    void run(void* const* buffers, int64_t* err) override { built_now()->run(buffers, err); }
    std::shared_ptr<Executable> built_now() {
        std::lock_guard<std::mutex> lock(building);
        if (!built) built = make();
        return built;
    }
    std::function<std::shared_ptr<Executable>()> make;
    std::mutex building;
    std::shared_ptr<Executable> built;
};

void BackgroundBuilds::add(std::weak_ptr<CompiledProgram> program, CompileJob job) {
    std::lock_guard<std::mutex> lock(m_);
    if (stopping_) return;
    if (this_process() != owner_) {   // forked: the parent's thread and jobs are not here
        owner_ = this_process();
        worker_ = nullptr;
        jobs_.clear();
        busy_ = false;
    }
    if (!worker_) worker_ = new std::thread([this] { work(); });
    jobs_.push_back({std::move(program), std::move(job)});
    wake_.notify_one();
}
void BackgroundBuilds::work() {
    in_background_build = true;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
        wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        Job next = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
        lock.unlock();
        try {
            if (!next.program.expired()) {
                auto t0 = std::chrono::steady_clock::now();
                ProgramFn fn = compile_c(next.job);
                if (auto p = next.program.lock()) {
                    p->fn.store(fn, std::memory_order_release);
                    if (p->announce)
                        std::fprintf(stderr, "[tg] %-28s optimized build ready  %.3f s\n",
                                     p->name.c_str(), seconds_since(t0));
                }
            }
        } catch (const std::exception& e) {
            if (!background_stopping)
                std::fprintf(stderr, "[tg] the optimized build of a program failed; it keeps "
                                     "its quick build: %s\n", e.what());
        }
        lock.lock();
        busy_ = false;
        idle_.notify_all();
    }
}

// Host buffers. Under AddressSanitizer each is a heap block of exactly its bytes, never kept
// for reuse: a kernel built with -fsanitize=address (TG_CFLAGS) that touches a byte past a
// tensor, or a freed one, is then reported, where a block rounded up to 64 bytes, or kept for
// the next buffer of its size, would hide it. Otherwise:
#if defined(__SANITIZE_ADDRESS__)
#define TG_EXACT_HEAP_BUFFERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TG_EXACT_HEAP_BUFFERS 1
#endif
#endif
#ifndef TG_EXACT_HEAP_BUFFERS
// Freed blocks of BLOCK_REUSE_MIN bytes or more wait, by size, for the next allocation of that
// size (an eager step allocates the same temporaries and gradients at every step): the memory
// comes back without the page faults of a fresh mapping. At most BLOCKS_KEPT_MAX bytes wait.
// The table is never destroyed: a tensor may free its buffer after static destructors ran.
struct KeptBlocks {
    std::mutex mutex;
    std::unordered_map<void*, size_t> size_of;   // blocks of the reused sizes, in use
    std::unordered_multimap<size_t, void*> freed;   // and freed, by size
    size_t bytes = 0;
};
static KeptBlocks& kept_blocks() {
    static KeptBlocks* table = new KeptBlocks;
    return *table;
}
// A block of BLOCK_REUSE_MIN bytes or more is mapped with its pages (MAP_POPULATE): one system
// call instead of a page fault for each 4 KB at first touch, which a virtual machine makes
// dear (384 KB copied into a new block, 3 runs each: 1.0-1.5 ms faulted page by page, 0.5-0.9
// ms mapped with its pages).
static void* map_block(size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}
#endif
struct HostMemoryDevice : Device {
#ifdef TG_EXACT_HEAP_BUFFERS
    void* alloc(size_t bytes) override {
        void* p = nullptr;
        if (posix_memalign(&p, 64, bytes ? bytes : 1))
            fail(strf("out of memory allocating %zu bytes", bytes));
        return p;
    }
    void free(void* ptr) override { std::free(ptr); }
#else
    static constexpr size_t BLOCK_REUSE_MIN = size_t(64) << 10, BLOCKS_KEPT_MAX = size_t(256) << 20;
    void* alloc(size_t bytes) override {
        size_t size = (bytes + 63) / 64 * 64;
        KeptBlocks& k = kept_blocks();
        if (size >= BLOCK_REUSE_MIN) {
            std::lock_guard<std::mutex> lock(k.mutex);
            auto kept = k.freed.find(size);
            if (kept != k.freed.end()) {
                void* p = kept->second;
                k.freed.erase(kept);
                k.bytes -= size;
                k.size_of[p] = size;
                return p;
            }
        }
        bool block = size >= BLOCK_REUSE_MIN;
        void* p = block ? map_block(size) : std::aligned_alloc(64, size);
        if (!p) fail(strf("out of memory allocating %zu bytes", bytes));
        if (block) {
            std::lock_guard<std::mutex> lock(k.mutex);
            k.size_of[p] = size;
        }
        return p;
    }
    void free(void* ptr) override {
        KeptBlocks& k = kept_blocks();
        {
            std::lock_guard<std::mutex> lock(k.mutex);
            auto it = k.size_of.find(ptr);
            if (it != k.size_of.end()) {
                size_t size = it->second;
                k.size_of.erase(it);
                if (k.bytes + size <= BLOCKS_KEPT_MAX) {
                    k.freed.emplace(size, ptr);
                    k.bytes += size;
                } else {
                    munmap(ptr, size);
                }
                return;
            }
        }
        std::free(ptr);
    }
#endif
    void copy_in(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void copy_out(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void copy_to(Device& to, void* dst, const void* src, size_t bytes) override {
        if (to.host_memory()) copy_in(dst, src, bytes);
        else to.copy_in(dst, src, bytes);
    }
    bool host_memory() const override { return true; }
};

// A program of more than QUICK_MAX_WORK (Program::work) is built optimized at once: a single
// run of its quick build could take longer than the optimized build (a W2 step counts 5.9
// million and runs 1.9 ms quick-built, 0.1 ms optimized; a W3 step counts 1.6 billion).
static const int64_t QUICK_MAX_WORK = int64_t(1) << 25;

// A program of much C compiles as two files at once where there are two cores (the W2 step:
// 0.76 s of cc in one process). Kernels are noinline either way, so the code, and every
// result, is the same. Below 32 KB the second compiler and the link cost more than they save:
// GCC 12 spent about 20 ms a KB at -O3 and 2.5 ms at -O0, and 0.1 s starting and linking each
// file (the tests' programs, one compile at a time, 2026-11-30); at -O0, which most programs
// of little work get, even 100 KB gains only some 0.1 s.
static size_t split_from() { return machine_cores() >= 2 ? 32 * 1024 : SIZE_MAX; }

// CPU:k (k >= 1) is a device of its own for data parallelism: its buffers are its own
// (host memory all the same), and work on its queue runs with its own thread pool, so several
// CPU devices run programs at once. A program compiled for one runs on all (one cache entry).
struct CpuDevice : HostMemoryDevice {
    explicit CpuDevice(int index = 0) : name_(index ? strf("CPU:%d", index) : "CPU") {}
    const char* name() const override { return name_.c_str(); }
    std::string settings() const override {
        return env_str("TG_CC", "") + '|' + env_str("TG_CFLAGS", "");
    }
    std::shared_ptr<Executable> prepare(const Program& p) override {
        return prepare_files(p, source_files(p), false);
    }
    std::vector<std::string> source_files(const Program& p) override {
        return render_c_files(p, split_from());
    }
    // later: still at once where the cache has it (only a compile is worth another thread)
    std::shared_ptr<Executable> prepare_files(const Program& p, std::vector<std::string> files,
                                              bool later) override {
        BuildPlan planned = plan(p, std::move(files));
        if (!later) return build(planned);
        if (std::shared_ptr<Executable> kept = build(planned, false)) return kept;
        planned.optimized.environment = environment_now();
        return std::make_shared<LaterExecutable>([planned] { return build(planned); });
    }
    std::string source(const Program& p) override { return render_c(p); }
    void queue_thread_start() override { thread_pool_here = &pool_; }
    bool runs_in_background() const override { return true; }

private:
    // what a build needs from the program and the environment, read on the host
    struct BuildPlan {
        CompileJob optimized;
        std::string optimization;   // TG_CFLAGS or OPTIMIZED_CFLAGS
        bool optimized_only;        // TG_CFLAGS given, TG_QUICK_RUNS=0 or much work
        int quick_runs;
        std::string name;
        bool announce;
    };
    static BuildPlan plan(const Program& p, std::vector<std::string> files) {
        std::string flags = env_str("TG_CFLAGS", "");
        std::string optimization = flags.empty() ? OPTIMIZED_CFLAGS : flags;
        int quick_runs = env_int("TG_QUICK_RUNS", 2, 0, INT32_MAX);
        bool optimized_only = !flags.empty() || quick_runs == 0 || p.work > QUICK_MAX_WORK;
        return {compile_job(std::move(files), optimization), optimization, optimized_only,
                quick_runs, p.name, debug_level() >= 1};
    }
    // The optimized build, else the quick one (asking for the optimized at a later run); null
    // where either needs a compiler's process and may_compile is false.
    static std::shared_ptr<Executable> build(BuildPlan plan, bool may_compile = true) {
        CompileJob& optimized = plan.optimized;
        if (!set_optimization(optimized, plan.optimization, may_compile)) return nullptr;
        auto compiled = [&](const CompileJob& job) {
            return may_compile ? compile_c(job) : find_compiled(job);
        };
        ProgramFn fn = plan.optimized_only ? compiled(optimized) : find_compiled(optimized);
        if (fn) return std::make_shared<CompiledProgram>(fn);
        if (plan.optimized_only) return nullptr;
        CompileJob quick_job = optimized;
        set_optimization(quick_job, QUICK_CFLAGS);
        ProgramFn quick_fn = compiled(quick_job);
        if (!quick_fn) return nullptr;
        auto quick = std::make_shared<CompiledProgram>(quick_fn);
        if (optimized.environment.empty()) optimized.environment = environment_now();
        quick->optimized = std::move(optimized);
        quick->quick_runs_left = plan.quick_runs;
        quick->name = plan.name;
        quick->announce = plan.announce;
        return quick;
    }
    std::string name_;
    ThreadPool pool_;
};

struct InterpDevice : HostMemoryDevice {
    const char* name() const override { return "INTERP"; }
    std::shared_ptr<Executable> prepare(const Program& p) override {
        return std::make_shared<Interpreter>(p);
    }
};

// Devices are never destroyed: a tensor may free its buffer after static destructors ran,
// and a queue's thread may still wait for work then.
static std::mutex device_table_mutex;
static std::map<std::string, Device*>& device_table() {
    static std::map<std::string, Device*>* table = new std::map<std::string, Device*>{
        {"CPU", new CpuDevice}, {"INTERP", new InterpDevice}};
    return *table;
}
static std::map<std::string, std::function<Device*(int)>>& device_kinds() {
    static auto* kinds = new std::map<std::string, std::function<Device*(int)>>{
        {"CPU", [](int index) -> Device* { return new CpuDevice(index); }}};
    return *kinds;
}

Device& device(const std::string& name_in) {
    std::string name = name_in;   // TG_DEVICE=cpu means CPU
    std::transform(name.begin(), name.end(), name.begin(), ::toupper);
    std::lock_guard<std::mutex> lock(device_table_mutex);
    auto& table = device_table();
    auto it = table.find(name);
    if (it != table.end()) return *it->second;
    size_t colon = name.find(':');
    std::string kind = name.substr(0, colon), digits = colon == std::string::npos ? "" :
                                                        name.substr(colon + 1);
    bool numbered = !digits.empty() && digits.size() <= 4 &&
                    std::all_of(digits.begin(), digits.end(), ::isdigit);
    if (numbered) {
        int index = std::stoi(digits);
        std::string canonical = index ? strf("%s:%d", kind.c_str(), index) : kind;
        if (table.count(canonical)) return *(table[name] = table[canonical]);
        auto make = device_kinds().find(kind);
        if (make != device_kinds().end() && index > 0)
            return *(table[name] = table[canonical] = make->second(index));
    }
    std::string known;
    for (auto& [n, d] : table) known += (known.empty() ? "" : ", ") + n;
    for (auto& [k, make] : device_kinds()) known += ", " + k + ":1, " + k + ":2, ...";
    fail("device: unknown device '" + name_in + "' (known: " + known + ")");
}
void register_device(const std::string& name, Device* dev) {
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    std::lock_guard<std::mutex> lock(device_table_mutex);
    device_table()[upper] = dev;
}
void register_device_kind(const std::string& kind, std::function<Device*(int)> make) {
    std::string upper = kind;
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    std::lock_guard<std::mutex> lock(device_table_mutex);
    device_kinds()[upper] = std::move(make);
}

// Through host memory: what a pair of devices that cannot copy directly does.
void Device::copy_to(Device& to, void* dst, const void* src, size_t bytes) {
    std::vector<char> host(bytes);
    copy_out(host.data(), src, bytes);
    to.copy_in(dst, host.data(), bytes);
}
WorkQueue& Device::queue() {
    std::call_once(queue_made_, [this] { queue_ = std::make_shared<ThreadQueue>(this); });
    return *queue_;
}
Device& default_device() { return device(env_str("TG_DEVICE", "CPU")); }
std::function<void(const Program&)>& program_observer() {
    static std::function<void(const Program&)> observer;
    return observer;
}

// ---- [REALIZE] the pipeline as one function of named steps ---------------------------- >>realize
// schedule → lower → passes → prepare (render + compile, or interpret) → allocate → run →
// the targets become BUFFER nodes. With TG_DEBUG each step can be watched; >= 2 also keeps
// the graph, the loop IR and the C of every program in the cache dir as NAME-HASH.*.

// Where TG_DEBUG keeps a program's files: its name and a hash of its loop IR.
static std::string artifact_stem(const Program& p) {
    return cache_dir() + "/" + p.name + "-" + hex16(fnv1a64(program_listing(p))).substr(0, 8);
}
static void keep_artifacts(const Program& p, const std::string& graph, const std::string& ir,
                           const std::string& source, const char* source_suffix) {
    std::string stem = artifact_stem(p);
    write_file_atomic(stem + ".graph", graph);
    write_file_atomic(stem + ".ir", ir);
    if (!source.empty()) write_file_atomic(stem + source_suffix, source);
}

// What one run of a program used: the jit keeps it to run the program again.
struct ProgramRun {
    std::shared_ptr<Executable> exe;
    std::shared_ptr<const Program> prog;            // shared with the programs reused
    std::vector<Node*> owners;                      // per program buffer: its storage's node
    std::vector<std::shared_ptr<Buffer>> buffers;   // per program buffer
    std::unordered_map<Node*, int> buffer_ids;
    std::vector<NodeP> targets;
};

// After a program ran: the buffers it wrote in place count as updated now.
static void note_updates(const Program& prog, const std::vector<std::shared_ptr<Buffer>>& bufs) {
    if (prog.updates.empty()) return;
    uint64_t now = ++update_count;
    for (auto& [id, loc] : prog.updates) {
        bufs[size_t(id)]->written_at = now;
        bufs[size_t(id)]->written_by = loc;
    }
}

static void check_errors(const Program& prog, const int64_t* err) {
    if (!err[0]) return;
    size_t site = size_t(err[0] - 1);
    const Program::Check& c = prog.checks[site];
    if (c.finite)
        fail(c.what + strf(" %s at element %lld", err[1] % 2 ? "an infinity" : "a NaN",
                           (long long)(err[1] / 2)), c.loc);
    fail(c.what + strf(": got %lld", (long long)err[1]), c.loc);
}

static thread_local ProgramInfo last_program_info;

// The temporaries in memory some block touches and their bytes; local arrays are counted apart.
static void temporaries_of(const Program& p, int& count, int64_t& bytes, int* locals = nullptr) {
    std::vector<bool> touched(p.buffers.size());
    for (const Block& b : p.blocks)
        for (const Access& a : block_accesses(b).accesses) touched[size_t(a.buffer)] = true;
    count = 0;
    bytes = 0;
    if (locals) *locals = 0;
    for (size_t i = 0; i < p.buffers.size(); i++) {
        if (!touched[i] || p.buffers[i].role != ProgramBuffer::TEMP) continue;
        if (p.buffers[i].local_block >= 0) {
            if (locals) ++*locals;
            continue;
        }
        count++;
        bytes += temp_bytes(p.buffers[i]);
    }
}

// The device every target is computed on (constants: the default device).
static Device* device_of(const std::vector<NodeP>& targets) {
    Device* dev = nullptr;
    for (const NodeP& t : targets) {
        Device* d = node_device(t.get());
        if (d && dev && d != dev)
            fail(strf("one program cannot compute on two devices: %s and %s (a jitted step must "
                      "keep to one)", dev->name(), d->name()), t->loc);
        if (d) dev = d;
    }
    return dev ? dev : &default_device();
}

// -- programs reused by the graph's structure: an eager step builds the same graph each time
// (new nodes, the same ops, shapes, constants, lines and buffers); its program is found by a key of
// that structure before scheduling, so the step costs a walk over its graph instead of scheduling,
// lowering, the passes, rendering and hashing C. The key holds every field the pipeline reads, the
// settings it reads (TG_CHECK, TG_PASSES, TG_TILE_MIN_WORK, TG_PARALLEL_MIN_WORK, the compilers and
// their flags) and, for realized nodes, which distinct buffer each is; the reused program binds the
// new graph's nodes by their place in the graph's order.
struct ReusedProgram {
    std::shared_ptr<const Program> prog;       // shared by every run of it
    std::shared_ptr<Executable> exe;
    std::vector<int> owner_at;                 // per program buffer: its owner's place
    std::vector<std::pair<int, int>> ids;      // (place, program buffer) of buffer_ids
    std::vector<int> target_at;                // places of the schedule's targets
    ProgramInfo info;
};
static const size_t REUSED_PROGRAMS_MAX = 64;   // then the table starts again, empty
static std::mutex reused_mutex;
static std::unordered_map<std::string, std::shared_ptr<const ReusedProgram>>& reused_programs() {
    static std::unordered_map<std::string, std::shared_ptr<const ReusedProgram>> table;
    return table;
}
static std::shared_ptr<const ReusedProgram> remember_program(const std::string& key,
                                                             std::shared_ptr<ReusedProgram> r) {
    std::lock_guard<std::mutex> lock(reused_mutex);
    if (reused_programs().size() >= REUSED_PROGRAMS_MAX) reused_programs().clear();
    return reused_programs()[key] = std::move(r);
}
// The key's bytes, copied in place: an eager step's graph adds some twenty fields a node, and
// callgrind counted a string append a field as the costliest part of the walk.
struct KeyBytes {
    std::string& key;
    size_t used;
    explicit KeyBytes(std::string& k) : key(k), used(k.size()) {}
    ~KeyBytes() { key.resize(used); }
    void room(size_t bytes) {
        if (used + bytes > key.size()) key.resize(std::max(2 * key.size(), used + bytes));
    }
    template <class T> void add(const T& v) {   // after room() for it
        std::memcpy(&key[used], &v, sizeof v);
        used += sizeof v;
    }
};
// A file or device is named by its first place among the graph's (its name follows the
// graph's fields), so the key says the same in another process (see save_lowered).
using Places = NodeIndex;
struct GraphKey {
    std::string key;
    std::vector<Node*> order;          // the graph's nodes, sources first
    Places place;                      // each node's index in order
    std::vector<const char*> files;    // of the nodes' lines, in the key's order
};
template <class T> static int first_place(std::vector<T>& seen, T x) {
    for (size_t i = 0; i < seen.size(); i++)
        if (seen[i] == x) return int(i);
    seen.push_back(x);
    return int(seen.size()) - 1;
}
// The graph's fields, each node's after its sources'.
static bool graph_fields(const std::vector<NodeP>& targets, GraphKey& g,
                         std::vector<const Device*>& devices) {
    const Places& place = g.place;
    KeyBytes bytes(g.key);
    std::unordered_map<const Buffer*, int> slot;
    std::unordered_set<const Buffer*> assigned;
    for (Node* n : g.order) {
        bytes.room(128 + 8 * (n->shape.size() + n->arg.size() + n->src.size()));
        bytes.add(n->dtype);
        bytes.add(n->shape.size());
        for (int64_t d : n->shape) bytes.add(d);
        if (n->buffer) {   // an input: which distinct buffer, and where it lives
            auto s = slot.emplace(n->buffer.get(), int(slot.size())).first->second;
            bytes.add('B');
            bytes.add(s);
            bytes.add(first_place<const Device*>(devices, n->buffer->device));
            continue;
        }
        check_fresh(n);
        if (n->op == Op::ASSIGN && !assigned.insert(n->src[0]->buffer.get()).second) return false;
        bytes.add(n->op);
        bytes.add(n->value);
        bytes.add(n->phase);
        bytes.add(n->leaf);
        bytes.add(n->requires_grad);
        bytes.add(first_place<const Device*>(devices, n->device));
        bytes.add(first_place(g.files, n->loc.file));
        bytes.add(n->loc.line);
        bytes.add(n->arg.size());
        for (int64_t a : n->arg) bytes.add(a);
        bytes.add(n->src.size());
        for (auto& src : n->src) bytes.add(*place.find(src.get()));
    }
    bytes.room(4 * targets.size());
    for (const NodeP& t : targets) bytes.add(*place.find(t.get()));
    return true;
}
// False where the graph must take the full pipeline (which reports its errors): an assignment
// to a buffer that another assignment of the graph also writes.
static bool structural_key(const std::vector<NodeP>& targets, Device* dev, GraphKey& g) {
    Places& place = g.place;
    place = NodeIndex();
    g.order = graph_toposort(targets, false, &place);
    g.key = std::string(dev->name()) + '|' + env_str("TG_CHECK", "") + '|' +
            env_str("TG_PASSES", "") + '|' + env_str("TG_TILE_MIN_WORK", "") + '|' +
            env_str("TG_PARALLEL_MIN_WORK", "") + '|' + dev->settings() + '|';
    g.files.clear();
    std::vector<const Device*> devices;
    if (!graph_fields(targets, g, devices)) return false;
    for (const char* f : g.files) g.key += std::string(f ? f : "") + '\0';
    for (const Device* d : devices) g.key += std::string(d ? d->name() : "-") + '\0';
    return true;
}
// The run of r for the graph whose nodes are order.
static void bind_reused(const ReusedProgram& r, const std::vector<Node*>& order, ProgramRun& run) {
    run.exe = r.exe;
    run.prog = r.prog;
    for (int at : r.owner_at) run.owners.push_back(order[size_t(at)]);
    for (auto [at, id] : r.ids) run.buffer_ids[order[size_t(at)]] = id;
    for (int at : r.target_at) run.targets.push_back(order[size_t(at)]->shared_from_this());
    last_program_info = r.info;
}
static bool reuse_program(const std::string& key, const std::vector<Node*>& order,
                          ProgramRun& run) {
    std::shared_ptr<const ReusedProgram> r;
    {
        std::lock_guard<std::mutex> lock(reused_mutex);
        auto it = reused_programs().find(key);
        if (it == reused_programs().end()) return false;
        r = it->second;
    }
    bind_reused(*r, order, run);
    std::lock_guard<std::mutex> lock(runtime_mutex);
    global_stats.memory_cache_hits++;
    return true;
}
static std::shared_ptr<const ReusedProgram> keep_program(const std::string& key,
                                                         const Places& place,
                                                         const ProgramRun& run) {
    auto r = std::make_shared<ReusedProgram>();
    auto at = [&](const Node* n) {
        const int* at = place.find(n);
        return at ? *at : -1;
    };
    for (Node* owner : run.owners) r->owner_at.push_back(at(owner));
    for (auto& [n, id] : run.buffer_ids) r->ids.push_back({at(n), id});
    for (const NodeP& t : run.targets) r->target_at.push_back(at(t.get()));
    for (std::vector<int>* places : {&r->owner_at, &r->target_at})
        if (std::count(places->begin(), places->end(), -1)) return nullptr;   // off the graph
    for (auto& [place_of, id] : r->ids)
        if (place_of < 0) return nullptr;
    r->prog = run.prog;
    r->exe = run.exe;
    r->info = last_program_info;
    return remember_program(key, std::move(r));
}

// -- programs kept on disk by the graph's structure: a process that builds a graph that an
// earlier one built (a script run again) reads what a run needs (the program's buffers,
// checks and updates, where the graph's nodes bind, its C files) from the cache directory and
// finds the compiled program there, without scheduling, lowering, the passes or rendering
// (W2's step program in a warm process: 5.4 ms instead of 10.5, 2.6-3.4 of them its run).
// Where the device's programs are C files (CPU).
// The entry is named by a hash of the structural key and of the implementation's file (its
// path, size, inode and time: a rebuilt tinygrad may lower otherwise) and holds the whole key,
// compared when read. Lines are kept as the key's file places and bound to the new graph's.
static const std::string& implementation_identity() {
    static const std::string id = [] {   // the file mapped where this function's code lies
        std::string maps, out;
        if (!read_file("/proc/self/maps", maps)) return out;
        auto here = uintptr_t(reinterpret_cast<void*>(&implementation_identity));
        std::istringstream lines(maps);
        for (std::string line; out.empty() && std::getline(lines, line);) {
            unsigned long long from = 0, to = 0;
            int path_at = 0;
            int got = std::sscanf(line.c_str(), "%llx-%llx %*s %*s %*s %*s %n", &from, &to,
                                  &path_at);
            if (got < 2 || here < from || here >= to || path_at <= 0 ||
                line[size_t(path_at)] != '/')
                continue;
            out = file_identity(line.substr(size_t(path_at)));
        }
        return out;
    }();
    return id;
}
static std::string lowered_path(const std::string& key) {
    const std::string& impl = implementation_identity();
    if (impl.empty()) return "";
    return cache_dir() + "/lowered-" + hex16(fnv1a64_joined({&key, &impl})) + ".bin";
}
struct EntryBytes {   // numbers as their 8 bytes, strings after their length
    std::string bytes;
    void num(int64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); }
    void str(const std::string& s) {
        num(int64_t(s.size()));
        bytes += s;
    }
    template <class F, class T> void list(const std::vector<T>& v, F each) {
        num(int64_t(v.size()));
        for (const T& x : v) each(x);
    }
};
struct EntryReader {
    const std::string& bytes;
    size_t at = 0;
    bool ok = true;
    int64_t num() {
        int64_t v = 0;
        if (at + sizeof v > bytes.size()) ok = false;
        else std::memcpy(&v, &bytes[at], sizeof v);
        at += sizeof v;
        return v;
    }
    std::string str() {
        int64_t n = num();
        if (!ok || n < 0 || size_t(n) > bytes.size() - at) {
            ok = false;
            return "";
        }
        at += size_t(n);
        return bytes.substr(at - size_t(n), size_t(n));
    }
    bool str_is(const std::string& s) {   // compared where it lies: a key is long
        int64_t n = num();
        ok = ok && n == int64_t(s.size()) && size_t(n) <= bytes.size() - at &&
             bytes.compare(at, s.size(), s) == 0;
        at += s.size();
        return ok;
    }
    template <class T, class F> void list(std::vector<T>& v, F each) {
        int64_t n = num();
        if (n < 0 || size_t(n) > bytes.size()) ok = false;
        for (int64_t i = 0; ok && i < n; i++) v.push_back(each());
    }
};
static const char* const LOWERED_MAGIC = "tinygrad lowered program 1";

static void save_lowered(const GraphKey& g, const ReusedProgram& r,
                         const std::vector<std::string>& files) {
    std::string path = lowered_path(g.key);
    if (path.empty() || files.empty()) return;
    const Program& p = *r.prog;
    EntryBytes e;
    bool lines_known = true;
    auto line = [&](Loc loc) {
        auto f = std::find(g.files.begin(), g.files.end(), loc.file);
        lines_known &= f != g.files.end();
        e.num(f - g.files.begin());
        e.num(loc.line);
    };
    e.str(LOWERED_MAGIC);
    e.str(g.key);
    e.str(p.name);
    e.list(p.buffers, [&](const ProgramBuffer& b) {
        for (int64_t v : {int64_t(b.role), int64_t(b.dtype), b.numel, b.offset,
                          int64_t(b.local_block), int64_t(b.local_loop)})
            e.num(v);
    });
    e.list(p.checks, [&](const Program::Check& c) {
        e.str(c.what);
        line(c.loc);
        e.num(c.finite);
    });
    e.list(p.updates, [&](const std::pair<int, Loc>& u) {
        e.num(u.first);
        line(u.second);
    });
    e.num(p.arena_bytes);
    e.num(p.work);
    for (const std::vector<int>* v : {&r.owner_at, &r.target_at})
        e.list(*v, [&](int x) { e.num(x); });
    e.list(r.ids, [&](std::pair<int, int> x) {
        e.num(x.first);
        e.num(x.second);
    });
    const ProgramInfo& i = r.info;
    e.str(i.name);
    for (int64_t v : {int64_t(i.nests_lowered), int64_t(i.nests), int64_t(i.temporaries_lowered),
                      int64_t(i.temporaries), int64_t(i.local_arrays), int64_t(i.tiled_nests),
                      i.temp_bytes_lowered, i.temp_bytes, i.arena_bytes})
        e.num(v);
    e.list(files, [&](const std::string& f) { e.str(f); });
    if (!lines_known) return;
    try {
        write_file_atomic(path, e.bytes);
    } catch (const Error&) {   // a cache that takes no new files: the next process lowers again
    }
}

// The program of g's graph from its entry, kept in memory as a reused one; null where there
// is none (or it is not this key's, or not whole).
static std::shared_ptr<const ReusedProgram> load_lowered(const GraphKey& g, Device& dev,
                                                         bool compile_later) {
    std::string path = lowered_path(g.key), bytes;
    if (path.empty() || !read_file(path, bytes) || !private_file(path)) return nullptr;
    EntryReader in{bytes};
    if (!in.str_is(LOWERED_MAGIC) || !in.str_is(g.key)) return nullptr;
    auto prog = std::make_shared<Program>();
    Program& p = *prog;
    auto line = [&] {
        int64_t f = in.num(), l = in.num();
        if (f < 0 || size_t(f) >= g.files.size()) in.ok = false;
        Loc loc;
        loc.file = in.ok ? g.files[size_t(f)] : nullptr;
        loc.line = int(l);
        return loc;
    };
    p.name = in.str();
    in.list(p.buffers, [&] {
        ProgramBuffer b;
        b.role = ProgramBuffer::Role(in.num());
        b.dtype = DType(in.num());
        b.numel = in.num();
        b.offset = in.num();
        b.local_block = int(in.num());
        b.local_loop = int(in.num());
        return b;
    });
    in.list(p.checks, [&] {
        Program::Check c;
        c.what = in.str();
        c.loc = line();
        c.finite = in.num() != 0;
        return c;
    });
    in.list(p.updates, [&] {
        int id = int(in.num());
        return std::pair<int, Loc>(id, line());
    });
    p.arena_bytes = in.num();
    p.work = in.num();
    auto r = std::make_shared<ReusedProgram>();
    for (std::vector<int>* v : {&r->owner_at, &r->target_at})
        in.list(*v, [&] { return int(in.num()); });
    in.list(r->ids, [&] {
        int at = int(in.num());
        return std::pair<int, int>(at, int(in.num()));
    });
    ProgramInfo& i = r->info;
    i.name = in.str();
    for (int* v : {&i.nests_lowered, &i.nests, &i.temporaries_lowered, &i.temporaries,
                   &i.local_arrays, &i.tiled_nests})
        *v = int(in.num());
    for (int64_t* v : {&i.temp_bytes_lowered, &i.temp_bytes, &i.arena_bytes}) *v = in.num();
    std::vector<std::string> files;
    in.list(files, [&] { return in.str(); });
    if (!in.ok || in.at != bytes.size() || files.empty()) return nullptr;
    int n_buffers = int(p.buffers.size()), n_nodes = int(g.order.size());
    auto place_ok = [&](int at) { return at >= 0 && at < n_nodes; };
    for (const std::vector<int>* v : {&r->owner_at, &r->target_at})
        if (!std::all_of(v->begin(), v->end(), place_ok)) return nullptr;
    if (int(r->owner_at.size()) != n_buffers) return nullptr;
    for (auto [at, id] : r->ids)
        if (!place_ok(at) || id < 0 || id >= n_buffers) return nullptr;
    for (const auto& u : p.updates)
        if (u.first < 0 || u.first >= n_buffers) return nullptr;
    r->prog = prog;
    r->exe = dev.prepare_files(p, std::move(files), compile_later);
    if (!r->exe) return nullptr;
    return remember_program(g.key, std::move(r));
}

// Steps 1-4 of the pipeline; false where there is nothing to compute.
// files: the C files it compiled, where the device's programs are such.
static bool build_program(const std::vector<NodeP>& targets, Device& dev, ProgramRun& run,
                          bool compile_later = false, std::vector<std::string>* files = nullptr) {
    int debug = debug_level();
    Schedule sched;                                              // 1. kernels and buffers
    auto planned = std::make_shared<Program>();                  // 2. loop IR
    Program& prog = *planned;
    prog = plan_program(targets, sched, run.buffer_ids, env_int("TG_CHECK", 0, 0, 1),
                        dev.recomputes_calls());
    run.targets = sched.targets;
    run.owners = std::move(prog.buffer_nodes);   // bound to this graph: the program is shared
    prog.buffer_nodes.clear();
    run.prog = planned;
    if (sched.kernels.empty()) return false;
    std::string before = debug >= 2 ? program_listing(prog) : "";
    ProgramInfo& info = last_program_info;
    info = ProgramInfo{prog.name, int(prog.blocks.size())};
    temporaries_of(prog, info.temporaries_lowered, info.temp_bytes_lowered);
    run_passes(prog, &dev);                                      // 3. passes
    info.nests = int(prog.blocks.size());
    for (const Block& b : prog.blocks) info.tiled_nests += b.tile.rows > 0;
    temporaries_of(prog, info.temporaries, info.temp_bytes, &info.local_arrays);
    info.arena_bytes = prog.arena_bytes;
    if (debug >= 2) {
        std::string ir = program_listing(prog);
        std::fprintf(stderr, "[tg] schedule of %s:\n%s", prog.name.c_str(),
                     sched_listing(sched).c_str());
        std::fprintf(stderr,
                     "[tg] %s: %d nests, %d temporaries (%lld bytes) as lowered; after the "
                     "passes %d nests (%d tiled products), %d local arrays, %d temporaries: "
                     "%lld bytes unplanned -> %lld planned\n",
                     prog.name.c_str(), info.nests_lowered, info.temporaries_lowered,
                     (long long)info.temp_bytes_lowered, info.nests, info.tiled_nests,
                     info.local_arrays,
                     info.temporaries, (long long)info.temp_bytes, (long long)info.arena_bytes);
        if (debug >= 3)
            std::fprintf(stderr, "[tg] loop IR before passes:\n%s[tg] after passes:\n%s",
                         before.c_str(), ir.c_str());
        std::string source = dev.source(prog);
        if (debug >= 4 && !source.empty())
            std::fprintf(stderr, "[tg] %s source:\n%s", dev.name(), source.c_str());
        keep_artifacts(prog, graph_listing(sched.targets),
                       "before passes:\n" + before + "\nafter passes:\n" + ir, source,
                       dev.source_suffix());
    }
    if (program_observer()) program_observer()(prog);
    std::vector<std::string> sources = dev.source_files(prog);   // 4. compile (or interpret)
    if (files) *files = sources;
    run.exe = sources.empty() ? dev.prepare(prog)
                              : dev.prepare_files(prog, std::move(sources), compile_later);
    return true;
}

// The program an earlier process kept on disk for the graph of key g (null: not reusable),
// else steps 1-4 (then kept); false where there is nothing to compute.
static bool load_or_build(const std::vector<NodeP>& targets, Device& dev, const GraphKey* g,
                          bool compile_later, ProgramRun& run) {
    if (auto loaded = g ? load_lowered(*g, dev, compile_later) : nullptr) {
        bind_reused(*loaded, g->order, run);
        return true;
    }
    std::vector<std::string> files;
    if (!build_program(targets, dev, run, compile_later, &files)) return false;
    if (auto kept = g ? keep_program(g->key, g->place, run) : nullptr)
        save_lowered(*g, *kept, files);
    return true;
}

// Storage for every buffer of a program on dev: given(i) where it gives one (an input's or an
// in-place target's own), a part of one arena for the planned temporaries, else its own.
static std::vector<std::shared_ptr<Buffer>> allocate_buffers(
    const Program& prog, Device& dev,
    const std::function<std::shared_ptr<Buffer>(size_t)>& given,
    const std::vector<int>& unbound = {}) {   // left null: each run binds them
    std::vector<std::shared_ptr<Buffer>> out(prog.buffers.size());
    std::shared_ptr<Buffer> arena =
        prog.arena_bytes ? std::make_shared<Buffer>(&dev, DType::BOOL, prog.arena_bytes) : nullptr;
    for (size_t i = 0; i < prog.buffers.size(); i++) {
        const ProgramBuffer& pb = prog.buffers[i];
        if ((out[i] = given(i)) || std::count(unbound.begin(), unbound.end(), int(i))) continue;
        if (arena && pb.offset >= 0)
            out[i] = std::make_shared<Buffer>(arena, pb.offset, pb.dtype, pb.numel);
        else out[i] = std::make_shared<Buffer>(&dev, pb.dtype, pb.numel);
    }
    return out;
}

// Programs in the background. An optimizer's step queues its program on the device's queue
// and returns (realize_nodes with in_background), so the caller builds the next step's graph
// while it runs: an eager training step's graph building and its program overlap, on two
// cores. Up to BACKGROUND_DEPTH programs per device are in flight, so the queue's thread goes
// from one step's program to the next without waiting to be woken. A program run at once on
// the device, a read of a buffer a program in flight may use (await_buffer), Jit and
// DataParallel steps and tg::synchronize() wait for them, and the first of them throws the
// error of one that failed. A failed program's results throw its error whenever they are
// read, and the programs queued behind it on its device do not run (they fail with it), so
// a failed bounds check still leaves every buffer as it was before that step.
static const size_t BACKGROUND_DEPTH = 2;
// Runs a program, adding its time to the stats; the seconds it took.
static double run_timed(Executable& exe, void* const* ptrs, int64_t* err) {
    auto t0 = std::chrono::steady_clock::now();
    exe.run(ptrs, err);
    double seconds = seconds_since(t0);
    std::lock_guard<std::mutex> lock(runtime_mutex);
    global_stats.run_seconds += seconds;
    return seconds;
}
// What a program in the background holds. The host thread makes and frees it: the queue's
// thread only runs it (freeing there contends for malloc's lock and the reference counts
// with the host building the next step: an eager W2 step ran slower than at once).
struct BackgroundRun {
    std::shared_ptr<Executable> exe;
    std::shared_ptr<const Program> prog;
    std::vector<std::shared_ptr<Buffer>> buffers;
    std::vector<void*> ptrs;
    std::shared_ptr<RunOutcome> outcome = std::make_shared<RunOutcome>();
    std::shared_ptr<RunOutcome> before;   // the program queued just before it, if in flight
    int threads = thread_count();   // TG_THREADS read here, not on the queue's thread
    void run() {
        if (before && before->failed.load(std::memory_order_acquire)) {
            outcome->fail_with(before->error, true);
            return;
        }
        ThreadsHere with(threads);
        int64_t err[2] = {0, 0};
        try {
            exe->build();   // a setup program's compile (prepare_files, later)
            run_timed(*exe, ptrs.data(), err);
            check_errors(*prog, err);
        } catch (...) {
            outcome->fail_with(std::current_exception());
        }
    }
};
struct InFlight {
    Device* dev;
    uint64_t event;            // its queue's event after the program
    uint64_t buffers_before;   // it uses buffers made before it was queued, no others
    std::shared_ptr<BackgroundRun> job;
    pid_t owner;               // a child process after fork() has no queue thread to wait for
};
static std::mutex in_flight_mutex;
static std::vector<InFlight> in_flight;   // in each device's queue order

// A step of little work (Program::work below TG_BACKGROUND_MIN_WORK) runs at once: handing it
// to the queue's thread costs more than the overlap gives (an eager step of W1's 2-16-16-1
// MLP, 34 thousand statements run: 68 us at once, 106 us in the background; W2's, 5.9
// million: 180 us at once, 127 us in the background).
static bool background_allowed(const Device& dev) {
    return dev.runs_in_background() && debug_level() == 0 && !env_int("TG_SYNC", 0, 0, 1);
}
static bool run_in_background(const Device& dev, const Program& prog) {
    return background_allowed(dev) &&
           prog.work >= env_int("TG_BACKGROUND_MIN_WORK", 1 << 21, 0, INT32_MAX);
}
// Waits until at most `keep` programs are in flight on dev (the newest); throws the first
// error of those it waited for (once: a program that failed with an earlier one's error
// does not throw it again here).
static void finish_in_flight(Device& dev, size_t keep = 0) {
    std::vector<InFlight> done;
    {
        std::lock_guard<std::mutex> lock(in_flight_mutex);
        size_t on_dev = size_t(std::count_if(in_flight.begin(), in_flight.end(),
                                             [&](const InFlight& f) { return f.dev == &dev; }));
        for (auto it = in_flight.begin(); it != in_flight.end() && on_dev > keep;)
            if (it->dev == &dev) {
                done.push_back(*it);
                it = in_flight.erase(it);
                on_dev--;
            } else {
                ++it;
            }
    }
    if (done.empty()) return;
    if (done.back().owner == this_process()) dev.queue().wait(done.back().event);
    for (const InFlight& f : done)
        if (!f.job->outcome->inherited) f.job->outcome->rethrow_if_failed();
}
// wait(d) for every device, then the first error (in their order) once all are done
template <typename Wait> static void wait_each(const std::vector<Device*>& devs, Wait wait) {
    std::exception_ptr first;
    for (Device* d : devs) try {
            wait(*d);
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    if (first) std::rethrow_exception(first);
}
static void finish_all_in_flight() {
    std::vector<Device*> devs;
    {
        std::lock_guard<std::mutex> lock(in_flight_mutex);
        for (const InFlight& f : in_flight)
            if (std::find(devs.begin(), devs.end(), f.dev) == devs.end()) devs.push_back(f.dev);
    }
    wait_each(devs, [](Device& d) { finish_in_flight(d); });
}
// A program's failure nobody read is said at exit rather than lost.
static void finish_in_flight_at_exit() {
    try {
        finish_all_in_flight();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tinygrad: a program that ran in the background failed, and "
                             "nothing read its results:\n%s\n", e.what());
    }
}
// The error of the failed program in the background that computed b (or what b is a part of).
static void throw_if_failed(const Buffer& b) {
    for (const Buffer* x = &b; x; x = x->arena.get())
        if (x->made_by) x->made_by->rethrow_if_failed();
}
// Before the host reads or writes b: the programs in the background that may use it are done.
static void await_buffer(const Buffer& b) {
    const Buffer* root = &b;
    while (root->arena) root = root->arena.get();
    bool used = false;
    {
        std::lock_guard<std::mutex> lock(in_flight_mutex);
        for (const InFlight& f : in_flight)
            used |= f.dev == root->device && root->made <= f.buffers_before;
    }
    if (used) finish_in_flight(*root->device);
    throw_if_failed(b);
}

// Queues a prepared program on the device's queue (see InFlight). Its error stays in its
// outcome, not in the queue, so the work behind it is not dropped unseen: it fails with it.
static std::shared_ptr<RunOutcome> run_in_flight(Device& dev, const ProgramRun& run,
                                                 std::vector<void*> ptrs) {
    static std::once_flag at_exit;
    std::call_once(at_exit, [] { std::atexit(finish_in_flight_at_exit); });
    finish_in_flight(dev, BACKGROUND_DEPTH - 1);
    auto job = std::make_shared<BackgroundRun>();
    job->exe = run.exe;
    job->prog = run.prog;
    job->buffers = run.buffers;
    job->ptrs = std::move(ptrs);
    {
        std::lock_guard<std::mutex> lock(in_flight_mutex);
        for (const InFlight& f : in_flight)
            if (f.dev == &dev) job->before = f.job->outcome;
    }
    uint64_t event = dev.queue().enqueue([run = job.get()] { run->run(); });
    std::lock_guard<std::mutex> lock(in_flight_mutex);
    in_flight.push_back({&dev, event, buffers_made.load(), job, this_process()});
    return job->outcome;
}

// How run_program runs a program: at once; as an optimizer's step (in the background where
// run_in_background says); or as setup, the parameters' initializers, built and run in the
// background wherever the device allows it, so the host traces and compiles the program that
// uses them meanwhile (a first training step: two compilers at once).
enum class RunMode { NOW, STEP, SETUP };

static ProgramRun run_program(std::vector<NodeP> targets, RunMode mode = RunMode::NOW) {
    auto t0 = std::chrono::steady_clock::now();
    Device* targets_device = device_of(targets);
    int debug = debug_level();
    ProgramRun run;
    Stats at_start = debug >= 1 ? stats() : Stats{};
    Device& dev = *targets_device;
    GraphKey g;
    bool reusable = debug < 2 && structural_key(targets, targets_device, g);
    bool setup_later = mode == RunMode::SETUP && background_allowed(dev);
    if (!reusable || !reuse_program(g.key, g.order, run)) {
        try {
            if (!load_or_build(targets, dev, reusable ? &g : nullptr, setup_later, run))
                return run;
        } catch (...) {   // this error is the one thrown; what failed in flight throws when read
            try {
                finish_in_flight(dev);
            } catch (...) {
            }
            throw;
        }
    }
    const Program& prog = *run.prog;
    bool background = (setup_later && run.exe && run.exe->needs_build()) ||
                      (mode == RunMode::STEP && run_in_background(dev, prog));
    if (!background) finish_in_flight(dev);   // the programs before it may write what it reads
    std::vector<void*> ptrs(prog.buffers.size());
    uint64_t made_before = buffers_made.load();
    run.buffers = allocate_buffers(prog, dev, [&](size_t i) { return run.owners[i]->buffer; });
    for (size_t i = 0; i < prog.buffers.size(); i++) {                  // 5.
        throw_if_failed(*run.buffers[i]);   // an input a failed program did not compute
        ptrs[i] = run.buffers[i]->ptr;
    }
    auto count_run = [&] {
        std::lock_guard<std::mutex> lock(runtime_mutex);
        global_stats.programs_run++;
        global_stats.background_runs += background;
    };
    double run_s = 0;
    std::shared_ptr<RunOutcome> outcome;
    if (background) {                                                   // 6. run
        outcome = run_in_flight(dev, run, std::move(ptrs));   // throws an earlier step's error
        count_run();
        note_updates(prog, run.buffers);
    } else {
        count_run();
        int64_t err[2] = {0, 0};
        run_s = run_timed(*run.exe, ptrs.data(), err);
        note_updates(prog, run.buffers);
        check_errors(prog, err);
    }
    for (const NodeP& t : run.targets) {                         // 7. results become buffers
        t->buffer = run.buffers[size_t(run.buffer_ids.at(t.get()))];
        if (outcome && t->buffer->made > made_before) t->buffer->made_by = outcome;
        if (!t->requires_grad || t->leaf) {   // its history is needed only for gradients
            t->op = Op::BUFFER;
            t->src.clear();
            t->arg.clear();
        }
    }
    if (debug >= 1) {
        Stats now = stats();
        std::fprintf(stderr,
                     "[tg] %-28s %s %2zu kernels  compiles %lld  disk hits %lld  memory hits %lld"
                     "  compile %.3f s  run %.3f ms  total %.3f ms\n",
                     prog.name.c_str(), dev.name(), size_t(last_program_info.nests),
                     (long long)(now.compiles - at_start.compiles),
                     (long long)(now.disk_cache_hits - at_start.disk_cache_hits),
                     (long long)(now.memory_cache_hits - at_start.memory_cache_hits),
                     now.compile_seconds - at_start.compile_seconds, run_s * 1e3,
                     seconds_since(t0) * 1e3);
    }
    return run;
}

// realize: the targets plus whatever backward() left pending, in one program (or, while a
// jit traces, noted for the jit's program). now skips the jit: for storage made on the way.
// A constant needs no kernel: its buffer is filled here and copied in, so parameters and
// optimizer state made by zeros() or ones() cost no compile.
static void fill_constant(Node* n, Device& dev) {
    int64_t count = shape_numel(n->shape);
    auto buf = std::make_shared<Buffer>(&dev, n->dtype, count);
    std::vector<char> host(buf->bytes());
    Num v = num_of(n->value, n->dtype);
    for (int64_t i = 0; i < count; i++) store_value(host.data(), n->dtype, i, v);
    dev.copy_in(buf->ptr, host.data(), host.size());
    n->buffer = buf;
    if (!n->requires_grad || n->leaf) n->op = Op::BUFFER;
}

// One program per device, in the order each device first appears among the targets.
static void run_per_device(const std::vector<NodeP>& targets, RunMode mode) {
    std::vector<std::pair<Device*, std::vector<NodeP>>> groups;
    for (const NodeP& t : targets) {
        Device* d = node_device(t.get());
        if (!d) d = &default_device();
        if (t->op == Op::CONST && !t->buffer) {
            fill_constant(t.get(), *d);
            continue;
        }
        auto g = std::find_if(groups.begin(), groups.end(), [&](auto& x) { return x.first == d; });
        if (g == groups.end()) groups.push_back({d, {t}});
        else g->second.push_back(t);
    }
    for (auto& [dev, group] : groups) run_program(group, mode);
}

// The devices whose queues took the setup program.
static std::vector<Device*> realize_pending_leaves(RunMode mode = RunMode::SETUP) {
    std::vector<NodeP> leaves;
    for (auto& w : pending_leaves)
        if (NodeP n = w.lock())
            if (n->leaf && !n->buffer) leaves.push_back(n);
    pending_leaves.clear();
    std::vector<Device*> queued;
    if (!leaves.empty()) run_per_device(leaves, mode);
    for (const NodeP& n : leaves)
        if (n->buffer && n->buffer->made_by &&
            std::find(queued.begin(), queued.end(), n->buffer->device) == queued.end())
            queued.push_back(n->buffer->device);
    return queued;
}

// A realize that is not a step's returns with the setup it queued done (its compile counted).
static void realize_nodes(const std::vector<NodeP>& targets, bool now, bool in_background) {
    std::vector<Device*> setup = realize_pending_leaves();
    std::vector<NodeP> all = targets;
    if (!now) {
        all.insert(all.end(), pending_grads.targets.begin(), pending_grads.targets.end());
        pending_grads.targets.clear();
        if (jit_capture) {
            jit_capture->insert(jit_capture->end(), all.begin(), all.end());
            return;
        }
    }
    run_per_device(all, in_background ? RunMode::STEP : RunMode::NOW);
    if (!now) pending_grads.forget_realized();
    if (!in_background) wait_each(setup, [](Device& d) { finish_in_flight(d); });
}

static std::shared_ptr<Buffer> copy_buffer(const Buffer& b, Device* to) {
    await_buffer(b);
    auto out = std::make_shared<Buffer>(to ? to : b.device, b.dtype, b.numel);
    b.device->copy_to(*out->device, out->ptr, b.ptr, b.bytes());
    return out;
}
}  // namespace detail

// ---- [JIT] trace a step once, then run its program ---------------------------------------- >>jit
// The first call runs the step with realizes collected (jit_capture) and runs them, with the
// returned tensor, as one program, keeping its executable and every buffer. A replay puts the
// new inputs' buffers into their slots and runs the executable again; parameters and
// optimizer state are updated in their own buffers. Tests: tests/test_training.cpp.
struct Jit::State {
    Step step;
    bool traced = false;
    ProgramRun run;                      // the traced program and every buffer it used
    std::vector<int> input_slots;        // program buffer of each input (-1: unused)
    std::vector<Shape> input_shapes;
    std::vector<DType> input_dtypes;
    NodeP output;                        // the traced output (a BUFFER after the first run)
    int output_slot = -1;
    int64_t replays = 0;
};

// What body asks to realize (and backward() leaves pending), collected instead of run.
static std::vector<NodeP> capture_realizes(const std::function<void()>& body) {
    std::vector<NodeP> captured;
    jit_capture = &captured;
    try {
        body();
    } catch (...) {
        jit_capture = nullptr;
        pending_grads.targets.clear();   // the gradients stay pending on their leaves
        throw;
    }
    jit_capture = nullptr;
    captured.insert(captured.end(), pending_grads.targets.begin(),
                    pending_grads.targets.end());
    pending_grads.targets.clear();
    return captured;
}

Jit::Jit(Step step) : state_(std::make_shared<State>()) { state_->step = std::move(step); }
int64_t Jit::replays() const { return state_->replays; }

Tensor Jit::operator()(const std::vector<Tensor>& inputs, Loc loc) {
    UserLocScope at(loc);
    State& st = *state_;
    realize_pending_leaves();   // parameters are computed once, not by every replay
    for (const Tensor& x : inputs)
        if (!x.realized()) realize_nodes({x.node()}, true);
    if (!st.traced) {
        Tensor out;
        std::vector<NodeP> captured = capture_realizes([&] { out = st.step(inputs); });
        if (!out.defined()) fail("jit: the step function returned an undefined tensor");
        captured.push_back(out.node());
        st.run = run_program(captured);
        for (const Tensor& x : inputs) {
            auto it = st.run.buffer_ids.find(x.node().get());
            st.input_slots.push_back(it == st.run.buffer_ids.end() ? -1 : it->second);
            st.input_shapes.push_back(x.shape());
            st.input_dtypes.push_back(x.dtype());
        }
        st.output = out.node();
        auto it = st.run.buffer_ids.find(st.output.get());
        st.output_slot = it == st.run.buffer_ids.end() ? -1 : it->second;
        st.traced = true;
        NodeP n = node_make(Op::BUFFER, out.dtype(), out.shape(), {}, out.node()->loc);
        n->buffer = copy_buffer(*out.node()->buffer);
        return wrap(n);
    }
    if (inputs.size() != st.input_shapes.size())
        fail(strf("jit: traced with %zu inputs, called with %zu", st.input_shapes.size(),
                  inputs.size()));
    for (size_t i = 0; i < inputs.size(); i++)
        if (inputs[i].shape() != st.input_shapes[i] || inputs[i].dtype() != st.input_dtypes[i])
            fail(strf("jit: input %zu is %s %s, traced as %s %s", i, dtype_name(inputs[i].dtype()),
                      shape_str(inputs[i].shape()).c_str(), dtype_name(st.input_dtypes[i]),
                      shape_str(st.input_shapes[i]).c_str()));
    for (size_t i = 0; i < inputs.size(); i++) {
        if (st.input_slots[i] < 0) continue;
        Device* traced_on = st.run.buffers[size_t(st.input_slots[i])]->device;
        if (inputs[i].node()->buffer->device != traced_on)
            fail(strf("jit: input %zu is on %s, traced on %s", i, inputs[i].device().c_str(),
                      traced_on->name()));
    }
    for (const auto& b : st.run.buffers)
        if (b->moved)
            fail("jit: a tensor the step was traced with has moved to another device since "
                 "(Module::to); trace the step again, in a new tg::Jit");
    if (!st.run.buffers.empty()) finish_in_flight(*st.run.buffers[0]->device);
    for (const Tensor& x : inputs) throw_if_failed(*x.node()->buffer);
    std::vector<void*> ptrs;
    for (auto& b : st.run.buffers) ptrs.push_back(b->ptr);
    for (size_t i = 0; i < inputs.size(); i++)
        if (st.input_slots[i] >= 0) ptrs[size_t(st.input_slots[i])] = inputs[i].node()->buffer->ptr;
    int64_t err[2] = {0, 0};
    double run_s = st.run.exe ? run_timed(*st.run.exe, ptrs.data(), err) : 0;
    note_updates(*st.run.prog, st.run.buffers);
    check_errors(*st.run.prog, err);
    {
        std::lock_guard<std::mutex> lock(runtime_mutex);
        global_stats.programs_run++;
    }
    st.replays++;
    if (debug_level() >= 1)
        std::fprintf(stderr, "[tg] jit %-24s replay %lld  compiles 0  run %.3f ms\n",
                     st.run.prog->name.c_str(), (long long)st.replays, run_s * 1e3);
    const Buffer& result =
        st.output_slot >= 0 ? *st.run.buffers[size_t(st.output_slot)] : *st.output->buffer;
    NodeP n = node_make(Op::BUFFER, st.output->dtype, st.output->shape, {}, st.output->loc);
    n->buffer = copy_buffer(result);
    return wrap(n);
}

Stats stats() {
    std::lock_guard<std::mutex> lock(detail::runtime_mutex);
    return detail::global_stats;
}

void finish_compiles() { detail::background_builds().finish(); }
void synchronize() { detail::finish_all_in_flight(); }
ProgramInfo last_program() { return detail::last_program_info; }
int threads() { return detail::thread_count(); }

Stages inspect(const std::vector<Tensor>& tensors, Loc loc) {
    UserLocScope at(loc);
    std::vector<NodeP> nodes;
    for (const Tensor& t : tensors) nodes.push_back(t.node());
    Schedule sched;
    std::unordered_map<Node*, int> buffer_ids;
    Program prog = plan_program(nodes, sched, buffer_ids, false, false);
    Stages st;
    st.graph = graph_listing(nodes);
    st.schedule = sched_listing(sched);
    st.loop_ir = program_listing(prog);
    // as the CPU runs them; passes that TG_PASSES names run whichever device they suit, so that
    // one pass's work can be seen (fuse_maps, the GPU's)
    bool named = env_str("TG_PASSES", "all") != "all";
    run_passes(prog, named ? nullptr : &device("CPU"));
    st.optimized_ir = program_listing(prog);
    st.c_source = render_c(prog);
    return st;
}

void realize(const std::vector<Tensor>& tensors, Loc loc) {
    std::vector<NodeP> nodes;
    for (const Tensor& t : tensors) nodes.push_back(N(check_defined(t, "realize", loc)));
    realize_nodes(nodes);
}

Tensor& Tensor::realize(Loc loc) {
    realize_nodes({N(check_defined(*this, "realize", loc))});
    return *this;
}

std::string Tensor::device() const {
    Device* d = node_device(node().get());
    return (d ? d : &default_device())->name();
}

// The value, computed on its device and copied. A leaf that requires grad gives a new leaf
// there (a parameter moved before training); gradients do not flow through the copy.
Tensor Tensor::to(const std::string& name, Loc loc) const {
    UserLocScope at(loc);
    Device& dst = detail::device(name);
    const NodeP& n = node();
    if (node_device(n.get()) == &dst) return *this;
    if (n->requires_grad && !n->leaf)
        fail(strf("to: the tensor (%s %s on %s) is computed from tensors that require grad, and "
                  "gradients do not flow between devices; move the leaves (parameters, inputs) "
                  "before building the graph, or detach() it", dtype_name(n->dtype),
                  shape_str(n->shape).c_str(), device().c_str()), loc);
    if (jit_capture)
        fail("to: a jitted step cannot move tensors between devices; move them before the step",
             loc);
    if (!n->buffer) realize_nodes({n}, true);
    NodeP out = node_make(Op::BUFFER, n->dtype, n->shape, {}, n->loc);
    out->buffer = copy_buffer(*n->buffer, &dst);
    Tensor t = wrap(out);
    if (n->leaf) t.requires_grad();
    return t;
}

// ---- [READ] reading results: item, to_vector, printing ----------------------------------- >>read

namespace detail {
// The bytes of a tensor's buffer, realizing it first.
static std::vector<char> tensor_bytes(const Tensor& t) {
    const NodeP& n = t.node();
    if (jit_capture)
        fail("a jitted function cannot read values (item, to_vector, printing): return the tensor");
    if (!n->buffer) realize_nodes({n});
    Buffer& b = *n->buffer;
    await_buffer(b);
    std::vector<char> raw(b.bytes());
    b.device->copy_out(raw.data(), b.ptr, b.bytes());
    return raw;
}
// A NaN's sign and payload are not part of its value (a C compiler may turn a + (-b) into
// a - b, which changes them): every NaN reads as the same quiet NaN, on every device.
std::vector<double> tensor_values(const Tensor& t, Loc loc) {
    check_defined(t, "to_vector", loc);
    std::vector<char> raw = tensor_bytes(t);
    std::vector<double> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); i++) {
        double v = num_double(load_value(raw.data(), t.dtype(), int64_t(i)), t.dtype());
        out[i] = std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v;
    }
    return out;
}
// Integers exactly (int64 beyond 2^53 too); floats truncated toward zero, saturating.
std::vector<int64_t> tensor_ints(const Tensor& t, Loc loc) {
    check_defined(t, "to_vector", loc);
    std::vector<char> raw = tensor_bytes(t);
    std::vector<int64_t> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); i++) {
        Num n = load_value(raw.data(), t.dtype(), int64_t(i));
        out[i] = dtype_is_float(t.dtype()) ? saturate_int(DType::INT64, n.f) : n.i;
    }
    return out;
}

// PyTorch's layout: floats with 4 decimals, or "1." when all are integers, or scientific
// notation when the magnitudes span more than 1000×; columns right-aligned to the widest
// finite value; lines wrapped at 80 columns; the middle of axes elided past 1000 elements.
static std::string format_tensor(const Tensor& t) {
    std::vector<double> v = tensor_values(t);
    DType dt = t.dtype();
    std::vector<int64_t> exact = dtype_is_float(dt) ? std::vector<int64_t>() : tensor_ints(t);
    const Shape& shape = t.shape();
    Shape st = contiguous_strides(shape);
    bool summarize = v.size() > 1000;
    auto shown = [&](size_t dim, int64_t i) {
        return !summarize || shape[dim] <= 6 || i < 3 || i >= shape[dim] - 3;
    };
    std::vector<size_t> visible;   // where the values printed are: they decide the format
    std::function<void(size_t, int64_t)> collect = [&](size_t dim, int64_t offset) {
        if (dim == shape.size()) { visible.push_back(size_t(offset)); return; }
        for (int64_t i = 0; i < shape[dim]; i++)
            if (shown(dim, i)) collect(dim + 1, offset + i * st[dim]);
    };
    if (!v.empty()) collect(0, 0);
    bool ints = true, sci = false;
    double max_abs = 0, min_abs = INFINITY;
    for (size_t at : visible) {
        double x = v[at];
        if (!std::isfinite(x) || x == 0) continue;
        ints = ints && x == std::floor(x);
        max_abs = std::max(max_abs, std::fabs(x));
        min_abs = std::min(min_abs, std::fabs(x));
    }
    if (max_abs > 0) sci = max_abs / min_abs > 1000 || max_abs > 1e8 || (!ints && min_abs < 1e-4);
    auto fmt = [&](size_t at) -> std::string {
        double x = v[at];
        if (dt == DType::BOOL) return x != 0 ? "True" : "False";
        if (!dtype_is_float(dt)) return strf("%lld", (long long)exact[at]);
        if (std::isnan(x)) return "nan";
        if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
        if (sci) return strf("%.4e", x);
        if (ints) return strf("%.0f.", x);
        return strf("%.4f", x);
    };
    size_t width = 0;
    for (size_t at : visible)
        if (!dtype_is_float(dt) || (std::isfinite(v[at]) && (v[at] != 0 || max_abs == 0)))
            width = std::max(width, fmt(at).size());
    auto cell = [&](size_t at) {
        std::string s = fmt(at);
        return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
    };
    std::function<std::string(size_t, int64_t)> rec = [&](size_t dim,
                                                          int64_t offset) -> std::string {
        if (dim == shape.size()) return cell(size_t(offset));
        int64_t n = shape[dim];
        size_t indent = 7 + dim;   // "tensor(" and one column per enclosing bracket
        std::vector<std::string> parts;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(dim, i)) {
                parts.push_back(dim + 1 == shape.size() ? " ..." : "...");
                i = n - 4;
                continue;
            }
            parts.push_back(rec(dim + 1, offset + i * st[dim]));
        }
        std::string out = "[";
        if (dim + 1 == shape.size()) {   // the last axis wraps to lines of at most 80 columns
            size_t per_line = std::max<size_t>(1, (80 - indent) / (width + 2));
            for (size_t i = 0; i < parts.size(); i++) {
                if (i) out += i % per_line ? ", " : ",\n" + std::string(indent + 1, ' ');
                out += parts[i];
            }
        } else {
            std::string sep =
                "," + std::string(shape.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
            for (size_t i = 0; i < parts.size(); i++)
                out += (i ? sep : "") + parts[i];
        }
        return out + "]";
    };
    std::string body = v.empty() ? "[]" : rec(0, 0);
    std::string suffix;
    if (v.empty() && shape.size() > 1) suffix += ", size=" + shape_str(shape);
    if (dt == DType::FLOAT64 || dt == DType::INT32)
        suffix += std::string(", dtype=") + dtype_name(dt);
    return "tensor(" + body + suffix + ")";
}
}  // namespace detail

// The line names the checks' errors only: reading runs the program as any realize does.
double Tensor::item(Loc loc) const {
    if (check_defined(*this, "item", loc).numel() != 1)
        fail(strf("item: tensor of shape %s has %lld elements, not 1", shape_str(shape()).c_str(),
                  (long long)numel()), loc);
    return tensor_values(*this)[0];
}
std::string Tensor::to_string() const { return format_tensor(*this); }
std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

// ---- [NN] layers, initialisers, losses ----------------------------------------------------- >>nn
// Compositions of the Tensor API only. Parameters are realized leaves that require grad.
// Tests: tests/test_training.cpp (and the losses' gradients in tests/test_autograd.cpp).
namespace nn {
namespace init {
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    return detail::add_c(detail::mul_c(Tensor::rand(shape, seed), high - low, {}), low, {});
}
// bound √(6/fan_in): uniform with the variance 2/fan_in that keeps ReLU activations steady
Tensor kaiming_uniform(const Shape& shape, int64_t fan_in, uint64_t seed, Loc loc) {
    double b = std::sqrt(6.0 / double(fan_in));
    return uniform(shape, -b, b, seed, loc);
}
Tensor kaiming_normal(const Shape& shape, int64_t fan_in, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    return detail::mul_c(Tensor::randn(shape, seed), std::sqrt(2.0 / double(fan_in)), {});
}
// bound √(6/(fan_in + fan_out)): variance 2/(fan_in + fan_out)
Tensor xavier_uniform(const Shape& shape, int64_t fan_in, int64_t fan_out, uint64_t seed,
                      Loc loc) {
    double b = std::sqrt(6.0 / double(fan_in + fan_out));
    return uniform(shape, -b, b, seed, loc);
}
Tensor xavier_normal(const Shape& shape, int64_t fan_in, int64_t fan_out, uint64_t seed,
                     Loc loc) {
    detail::UserLocScope at(loc);
    return detail::mul_c(Tensor::randn(shape, seed), std::sqrt(2.0 / double(fan_in + fan_out)), {});
}
}  // namespace init

Tensor Module::operator()(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return forward(x);
}
Module::Named Module::named_parameters() {
    Named out;
    for (auto& [name, child] : children())
        for (auto& [n, t] : child->named_parameters()) out.push_back({name + "." + n, t});
    return out;
}
Module::Named Module::named_buffers() {
    Named out;
    for (auto& [name, child] : children())
        for (auto& [n, t] : child->named_buffers()) out.push_back({name + "." + n, t});
    return out;
}
std::vector<Tensor> Module::parameters() {
    std::vector<Tensor> out;
    for (auto& [name, t] : named_parameters()) out.push_back(t);
    return out;
}
void Module::check_seed_count(const std::vector<uint64_t>& s, size_t wanted,
                              const char* layer) {
    if (s.size() != wanted)
        detail::fail(strf("%s: reset_parameters takes the %zu seeds it draws, got %zu", layer,
                          wanted, s.size()));
}
// A layer without children keeps its own seeds (Dropout's); one with children hands them out.
void Module::reset_parameters(const std::vector<uint64_t>& s) {
    std::vector<std::pair<std::string, Module*>> kids = children();
    size_t wanted = 0;
    for (auto& [name, child] : kids) wanted += child->seeds.size();
    check_seed_count(s, kids.empty() ? seeds.size() : wanted, "layer");
    seeds = s;
    size_t at = 0;
    for (auto& [name, child] : kids) {
        size_t n = child->seeds.size();
        std::vector<uint64_t> mine(s.begin() + long(at), s.begin() + long(at + n));
        at += n;
        if (mine != child->seeds) child->reset_parameters(mine);
    }
}
void Module::take_seeds_of_children() {
    seeds.clear();
    for (auto& [name, child] : children())
        seeds.insert(seeds.end(), child->seeds.begin(), child->seeds.end());
}
void Module::zero_grad() {
    for (Tensor& p : parameters()) p.zero_grad();
}
void Module::train(bool on) {
    training = on;
    for (auto& [name, child] : children()) child->train(on);
}
std::map<std::string, Tensor> Module::state_dict() {
    std::map<std::string, Tensor> out;
    for (auto& [name, t] : named_parameters()) out[name] = t;
    for (auto& [name, t] : named_buffers()) out[name] = t;
    return out;
}
void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict, Loc loc) {
    detail::UserLocScope at(loc);
    std::vector<std::pair<Tensor, Tensor>> copies;   // (parameter, value)
    std::string missing, unexpected;
    std::set<std::string> known;
    Named targets = named_parameters(), buffers = named_buffers();
    targets.insert(targets.end(), buffers.begin(), buffers.end());
    for (auto& [name, p] : targets) {
        known.insert(name);
        auto it = state.find(name);
        if (it == state.end()) {
            missing += (missing.empty() ? "" : ", ") + name;
            continue;
        }
        if (it->second.shape() != p.shape())
            detail::fail(strf("load_state_dict: %s is %s in the model but %s in the state",
                              name.c_str(), shape_str(p.shape()).c_str(),
                              shape_str(it->second.shape()).c_str()));
        copies.push_back({p, it->second});
    }
    for (auto& [name, t] : state)
        if (!known.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
    if (strict && (!missing.empty() || !unexpected.empty()))
        detail::fail("load_state_dict: " +
                     (missing.empty() ? "" : "missing from the state: " + missing) +
                     (!missing.empty() && !unexpected.empty() ? "; " : "") +
                     (unexpected.empty() ? "" : "not in the model: " + unexpected));
    std::vector<Tensor> assigns;
    for (auto& [p, v] : copies)
        assigns.push_back(p.assign(v.device() == p.device() ? v : v.to(p.device())));
    tg::realize(assigns);
}
// Each tensor's node takes a copy of its buffer on the device: every handle (the layer's, an
// optimizer's) sees it there. The copy counts as an in-place update, so a node built before
// that reads it is a stale read; the old buffer is marked, so a jitted step bound to it stops.
Module& Module::to(const std::string& name, Loc loc) {
    detail::UserLocScope at(loc);
    Device& dst = detail::device(name);
    if (detail::jit_capture)
        detail::fail("Module::to: a jitted step cannot move a layer; move it before the step");
    Named tensors = named_parameters(), buffers = named_buffers();
    tensors.insert(tensors.end(), buffers.begin(), buffers.end());
    detail::finish_all_in_flight();   // a step in the background may still write them
    std::vector<detail::NodeP> pending;
    for (auto& [label, t] : tensors) {
        if (!t.realized()) pending.push_back(t.node());
        if (t.grad().defined() && !t.grad().realized()) pending.push_back(t.grad().node());
    }
    if (!pending.empty()) detail::realize_nodes(pending, true);
    uint64_t now = ++detail::update_count;
    auto move = [&](detail::Node& n) {
        std::shared_ptr<detail::Buffer> copy = detail::copy_buffer(*n.buffer, &dst);
        copy->written_at = now;
        copy->written_by = loc;
        n.buffer->moved = true;
        n.buffer = std::move(copy);
        n.device = &dst;
    };
    for (auto& [label, t] : tensors) {
        detail::Node& n = *t.node();
        if (n.buffer->device == &dst) continue;
        move(n);
        if (!n.grad) continue;
        detail::NodeP g =
            detail::node_make(Op::BUFFER, n.grad->dtype, n.grad->shape, {}, n.grad->loc);
        g->buffer = n.grad->buffer;
        move(*g);
        n.grad = g;
    }
    return *this;
}

Linear::Linear(int64_t in, int64_t out, bool bias, Loc loc) : out_features(out), has_bias(bias) {
    detail::UserLocScope at(loc);
    if (in <= 0 || out <= 0)
        detail::fail(strf("Linear: sizes must be positive, got in %lld, out %lld", (long long)in,
                          (long long)out));
    in_features = in;
    reset_parameters(has_bias ? std::vector<uint64_t>{Tensor::next_seed(), Tensor::next_seed()}
                              : std::vector<uint64_t>{Tensor::next_seed()});
}
// PyTorch's default: U(-1/√in, 1/√in) for the weight and the bias
void Linear::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, in_features < 0 ? 0 : has_bias ? 2 : 1, "Linear");
    seeds = s;
    if (in_features < 0) return;   // nothing to draw before the first call
    double b = 1 / std::sqrt(double(in_features));
    weight = init::uniform({out_features, in_features}, -b, b, s.at(0)).requires_grad();
    if (has_bias) bias = init::uniform({out_features}, -b, b, s.at(1)).requires_grad();
}
Bilinear::Bilinear(int64_t in1, int64_t in2, int64_t out, bool bias, Loc loc)
    : in1_features(in1), in2_features(in2), out_features(out), has_bias(bias) {
    detail::UserLocScope at(loc);
    if (in1 <= 0 || in2 <= 0 || out <= 0)
        detail::fail(strf("Bilinear: sizes must be positive, got in1 %lld, in2 %lld, out %lld",
                          (long long)in1, (long long)in2, (long long)out));
    reset_parameters(has_bias ? std::vector<uint64_t>{Tensor::next_seed(), Tensor::next_seed()}
                              : std::vector<uint64_t>{Tensor::next_seed()});
}
void Bilinear::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, has_bias ? 2 : 1, "Bilinear");
    seeds = s;
    double b = 1 / std::sqrt(double(in1_features));
    weight = init::uniform({out_features, in1_features, in2_features}, -b, b, s.at(0))
                 .requires_grad();
    if (has_bias) bias = init::uniform({out_features}, -b, b, s.at(1)).requires_grad();
}
Module::Named Bilinear::named_parameters() {
    if (!has_bias) return {{"weight", weight}};
    return {{"weight", weight}, {"bias", bias}};
}
Tensor Bilinear::operator()(const Tensor& x1, const Tensor& x2, Loc loc) {
    return functional::bilinear(x1, x2, weight, bias, loc);
}
Tensor Bilinear::forward(const Tensor& x) {
    detail::fail(strf("Bilinear: forward(x) with x %s alone: it takes two inputs, (x1, x2)",
                      shape_str(x.shape()).c_str()));
}
Linear::Linear(int64_t out, Loc loc) : out_features(out) {
    detail::UserLocScope at(loc);
    if (out <= 0)
        detail::fail(strf("Linear: out_features must be positive, got %lld", (long long)out));
}
Tensor Linear::forward(const Tensor& x) {
    if (x.ndim() == 0) detail::fail("Linear: input must have at least one axis");
    if (in_features < 0) *this = Linear(x.size(-1), out_features, has_bias);
    if (x.size(-1) != in_features)
        detail::fail(strf("Linear: input %s does not end in in_features %lld",
                          shape_str(x.shape()).c_str(), (long long)in_features));
    return functional::linear(x, weight, has_bias ? bias : Tensor());
}
Module::Named Linear::named_parameters() {
    if (!weight.defined()) return {};
    if (!has_bias) return {{"weight", weight}};
    return {{"weight", weight}, {"bias", bias}};
}

// padding_idx within [-rows, rows), as a row: negative counts from the end
static std::optional<int64_t> padding_row(std::optional<int64_t> padding_idx, int64_t rows,
                                          const char* op) {
    if (!padding_idx) return padding_idx;
    if (*padding_idx < -rows || *padding_idx >= rows)
        detail::fail(strf("%s: padding_idx %lld is out of range for %lld embeddings", op,
                          (long long)*padding_idx, (long long)rows));
    return *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
}
Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding, Loc loc)
    : weight(Tensor::zeros({num, dim}, DType::FLOAT32, loc)) {
    detail::UserLocScope at(loc);
    padding_idx = padding_row(padding, num, "Embedding");
    reset_parameters({Tensor::next_seed()});   // weight holds only the shape until then
}
// N(0, 1) rows, the row padding_idx zeros (where given), as PyTorch's embeddings start
static Tensor embedding_init(const Shape& shape, uint64_t seed,
                             std::optional<int64_t> padding_idx) {
    Tensor w = Tensor::randn(shape, seed);
    if (padding_idx) {
        Tensor rows = Tensor::arange(shape[0]).reshape({-1, 1});
        w = where(rows == *padding_idx, 0.0f, w).realize();
    }
    return w.requires_grad();
}
void Embedding::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, 1, "Embedding");
    seeds = s;
    weight = embedding_init(weight.shape(), s.at(0), padding_idx);
}
Tensor Embedding::forward(const Tensor& ids) {
    return functional::embedding(ids, weight, padding_idx);
}
EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim, const std::string& mode_,
                           bool include_last_offset_, std::optional<int64_t> padding, Loc loc)
    : mode(mode_), include_last_offset(include_last_offset_) {
    detail::UserLocScope at(loc);
    if (num <= 0 || dim <= 0)
        detail::fail(strf("EmbeddingBag: sizes must be positive, got %lld, %lld",
                          (long long)num, (long long)dim));
    if (mode != "mean" && mode != "sum" && mode != "max")
        detail::fail(strf("EmbeddingBag: mode \"%s\" is not \"mean\", \"sum\" or \"max\"",
                          mode.c_str()));
    padding_idx = padding_row(padding, num, "EmbeddingBag");
    weight = Tensor::zeros({num, dim});
    reset_parameters({Tensor::next_seed()});
}
void EmbeddingBag::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, 1, "EmbeddingBag");
    seeds = s;
    weight = embedding_init(weight.shape(), s.at(0), padding_idx);
}
Tensor EmbeddingBag::forward(const Tensor& ids) { return (*this)(ids, Tensor()); }
Tensor EmbeddingBag::operator()(const Tensor& ids, const Tensor& offsets,
                                const Tensor& per_sample_weights, Loc loc) {
    return functional::embedding_bag(ids, weight, offsets, mode, per_sample_weights,
                                     include_last_offset, padding_idx, loc);
}

LayerNorm::LayerNorm(int64_t dim, double e, bool elementwise_affine, bool has_bias, Loc loc)
    : LayerNorm(Shape{dim}, e, elementwise_affine, has_bias, loc) {}
LayerNorm::LayerNorm(const Shape& shape, double e, bool elementwise_affine, bool has_bias,
                     Loc loc)
    : normalized_shape(shape), eps(e) {
    if (!elementwise_affine) return;
    weight = Tensor::ones(shape, DType::FLOAT32, loc).requires_grad();
    if (has_bias) bias = Tensor::zeros(shape, DType::FLOAT32, loc).requires_grad();
}
Module::Named LayerNorm::named_parameters() {
    Named named;
    if (weight.defined()) named.push_back({"weight", weight});
    if (bias.defined()) named.push_back({"bias", bias});
    return named;
}
Tensor LayerNorm::forward(const Tensor& x) {
    return functional::layer_norm(x, normalized_shape, weight, bias, eps);
}

RMSNorm::RMSNorm(int64_t dim, std::optional<double> e, bool elementwise_affine, Loc loc)
    : RMSNorm(Shape{dim}, e, elementwise_affine, loc) {}
RMSNorm::RMSNorm(const Shape& shape, std::optional<double> e, bool elementwise_affine, Loc loc)
    : normalized_shape(shape), eps(e) {
    if (elementwise_affine) weight = Tensor::ones(shape, DType::FLOAT32, loc).requires_grad();
}
Module::Named RMSNorm::named_parameters() {
    if (!weight.defined()) return {};
    return {{"weight", weight}};
}
Tensor RMSNorm::forward(const Tensor& x) {
    return functional::rms_norm(x, normalized_shape, weight, eps);
}

static void check_dropout_p(double p, const char* op) {
    if (!(p >= 0 && p <= 1)) detail::fail(strf("%s: p must be in [0, 1], got %g", op, p));
}
// kept: u >= p for u uniform in [0, 1), scaled by 1/(1-p); p = 1 zeroes (no 0·∞ in gradients)
static Tensor dropout_mask(const Tensor& x, double p, const Tensor& u) {
    if (p == 1) return x * 0;
    return where(u >= p, x * (1 / (1 - p)), 0);
}
Dropout::Dropout(double p_, Loc loc) : p(p_) {
    detail::UserLocScope at(loc);
    check_dropout_p(p, "Dropout");
    seeds = {Tensor::next_seed()};
}
// The count goes up before the mask is built: a mask that read it before would be stale.
// x's shape with its spatial axes 1: one draw per channel (errors name family + "2d", ...)
static Shape channel_mask_shape(const char* family, const Tensor& x, int spatial_axes) {
    if (x.ndim() != spatial_axes + 1 && x.ndim() != spatial_axes + 2)
        detail::fail(strf("%s%dd: x %s needs [N, C, %d spatial axes] or [C, ...]", family,
                          spatial_axes, shape_str(x.shape()).c_str(), spatial_axes));
    Shape mask = x.shape();
    std::fill(mask.end() - spatial_axes, mask.end(), 1);
    return mask;
}
Tensor Dropout::forward(const Tensor& x) { return dropped(x, 0); }
Tensor Dropout::dropped(const Tensor& x, int spatial_axes) {
    const Shape mask_shape =
        spatial_axes ? channel_mask_shape("Dropout", x, spatial_axes) : x.shape();
    if (!training || p == 0) return x;
    if (!dtype_is_float(x.dtype()))
        detail::fail(strf("Dropout%s: input %s %s is not a float tensor",
                          spatial_axes ? strf("%dd", spatial_axes).c_str() : "",
                          dtype_name(x.dtype()), shape_str(x.shape()).c_str()));
    if (!draws.defined() || draws.device() != x.device()) {
        // a buffer now, while a jit traces too: a constant count would fold into the program
        draws = Tensor::from_vector(std::vector<int64_t>{0}, {});
        if (draws.device() != x.device()) {
            draws = draws.to(x.device());
            detail::realize_nodes({draws.node()}, true);
        }
    }
    Tensor counted = draws.assign(draws + 1);
    counted.realize();
    Tensor u = rand_offset(mask_shape, detail::mix_seed(seeds.at(0), 0), draws, Loc::here());
    return dropout_mask(x, p, u);
}

namespace functional {
// Each picks its pieces with where, so that a piece's gradient reaches only the inputs it is
// picked for, with PyTorch's choice at the kinks; a NaN fails every comparison, which puts it
// in the piece where PyTorch's leaves it (NaN in each but softshrink's 0).
Tensor hardtanh(const Tensor& x, double min_val, double max_val, Loc loc) {
    detail::UserLocScope at(loc);
    if (!(min_val <= max_val))
        detail::fail(strf("hardtanh: min_val %g must not exceed max_val %g", min_val, max_val));
    return where(x <= min_val, min_val, where(x >= max_val, max_val, x));
}
Tensor relu6(const Tensor& x, Loc loc) { return hardtanh(x, 0, 6, loc); }
Tensor hardsigmoid(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return where(x <= -3, 0, where(x >= 3, 1, x / 6 + 0.5));
}
// the middle piece's slope (2x + 3)/6 at both ends, as PyTorch's
Tensor hardswish(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return where(x < -3, 0, where(x <= 3, x * (x + 3) / 6, x));
}
Tensor mish(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return x * x.softplus().tanh();
}
Tensor selu(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return x.elu(1.6732632423543772848170429916717) * 1.0507009873554804934193349852946;
}
Tensor celu(const Tensor& x, double alpha, Loc loc) {
    detail::UserLocScope at(loc);
    if (alpha == 0) detail::fail("celu: alpha must not be 0");
    return (x / alpha).elu() * alpha;
}
Tensor softsign(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return x / (x.abs() + 1);
}
// min(x, 0) - ln(1 + e^-|x|): no exponential overflows
Tensor logsigmoid(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return x.minimum(0) - (-x.abs()).exp().log1p();
}
Tensor tanhshrink(const Tensor& x, Loc loc) {
    detail::UserLocScope at(loc);
    return x - x.tanh();
}
Tensor hardshrink(const Tensor& x, double lambd, Loc loc) {
    detail::UserLocScope at(loc);
    return where(logical_and(x >= -lambd, x <= lambd), 0, x);
}
Tensor softshrink(const Tensor& x, double lambd, Loc loc) {
    detail::UserLocScope at(loc);
    if (!(lambd >= 0)) detail::fail(strf("softshrink: lambd %g must be at least 0", lambd));
    return where(x > lambd, x - lambd, where(x < -lambd, x + lambd, 0));
}
Tensor threshold(const Tensor& x, double threshold, double value, Loc loc) {
    detail::UserLocScope at(loc);
    return where(x <= threshold, value, x);
}
Tensor glu(const Tensor& x, int axis, Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(x, "glu", loc);
    if (x.ndim() == 0)
        detail::fail("glu: x is a scalar; it needs an axis to halve", loc);
    int64_t length = x.size(axis);
    if (length % 2)
        detail::fail(strf("glu: x %s has %lld along axis %d, not an even length",
                          shape_str(x.shape()).c_str(), (long long)length, axis));
    return x.slice(axis, 0, length / 2) * x.slice(axis, length / 2, length).sigmoid();
}
Tensor softmin(const Tensor& x, int axis, Loc loc) { return (-x).softmax(axis, loc); }
Tensor bilinear(const Tensor& x1, const Tensor& x2, const Tensor& weight, const Tensor& bias,
                Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "bilinear";
    detail::check_defined(x1, op, loc), detail::check_defined(x2, op, loc);
    detail::check_defined(weight, op, loc);
    Shape lead1(x1.shape().begin(), x1.shape().end() - (x1.ndim() ? 1 : 0));
    Shape lead2(x2.shape().begin(), x2.shape().end() - (x2.ndim() ? 1 : 0));
    bool fits = x1.ndim() >= 1 && x2.ndim() >= 1 && lead1 == lead2 && weight.ndim() == 3 &&
                weight.size(1) == x1.size(-1) && weight.size(2) == x2.size(-1) &&
                (!bias.defined() || bias.shape() == Shape{weight.size(0)});
    if (!fits)
        detail::fail(strf("bilinear: x1 %s, x2 %s, weight %s, bias %s: x1 [..., in1] and x2 "
                          "[..., in2] of one batch need weight [out, in1, in2] and bias [out]",
                          shape_str(x1.shape()).c_str(), shape_str(x2.shape()).c_str(),
                          shape_str(weight.shape()).c_str(),
                          bias.defined() ? shape_str(bias.shape()).c_str() : "none"));
    Tensor y = einsum("...i,oij,...j->...o", {x1, weight, x2});
    return bias.defined() ? y + bias : y;
}
Tensor prelu(const Tensor& x, const Tensor& weight, Loc loc) {
    detail::UserLocScope at(loc);
    const int64_t channels = x.ndim() >= 2 ? x.size(1) : 1;
    if (weight.ndim() != 1 || (weight.size(0) != 1 && weight.size(0) != channels))
        detail::fail(strf("prelu: weight %s must be [1] or [C] = [%lld] for x %s",
                          shape_str(weight.shape()).c_str(), (long long)channels,
                          shape_str(x.shape()).c_str()));
    Shape along_channels(size_t(x.ndim()), 1);
    if (x.ndim() >= 2) along_channels[1] = weight.size(0);
    return where(x > 0, x, weight.reshape(along_channels) * x);
}
}  // namespace functional

Hardtanh::Hardtanh(double min_val_, double max_val_, Loc loc)
    : min_val(min_val_), max_val(max_val_) {
    detail::UserLocScope at(loc);
    if (!(min_val <= max_val))
        detail::fail(strf("Hardtanh: min_val %g must not exceed max_val %g", min_val, max_val));
}
Tensor Hardtanh::forward(const Tensor& x) { return functional::hardtanh(x, min_val, max_val); }
Tensor ReLU6::forward(const Tensor& x) { return functional::relu6(x); }
Tensor Hardsigmoid::forward(const Tensor& x) { return functional::hardsigmoid(x); }
Tensor Hardswish::forward(const Tensor& x) { return functional::hardswish(x); }
Tensor Mish::forward(const Tensor& x) { return functional::mish(x); }
Tensor SELU::forward(const Tensor& x) { return functional::selu(x); }
Tensor CELU::forward(const Tensor& x) { return functional::celu(x, alpha); }
Tensor Softsign::forward(const Tensor& x) { return functional::softsign(x); }
Tensor LogSigmoid::forward(const Tensor& x) { return functional::logsigmoid(x); }
Tensor Tanhshrink::forward(const Tensor& x) { return functional::tanhshrink(x); }
Tensor Hardshrink::forward(const Tensor& x) { return functional::hardshrink(x, lambd); }
Softshrink::Softshrink(double lambd_, Loc loc) : lambd(lambd_) {
    detail::UserLocScope at(loc);
    if (!(lambd >= 0)) detail::fail(strf("Softshrink: lambd %g must be at least 0", lambd));
}
Tensor Softshrink::forward(const Tensor& x) { return functional::softshrink(x, lambd); }
Tensor Threshold::forward(const Tensor& x) { return functional::threshold(x, threshold, value); }
Tensor GLU::forward(const Tensor& x) { return functional::glu(x, dim); }
Tensor PairwiseDistance::operator()(const Tensor& x1, const Tensor& x2, Loc loc) {
    return functional::pairwise_distance(x1, x2, p, eps, keepdim, loc);
}
Tensor PairwiseDistance::forward(const Tensor& x) {
    detail::fail(strf("PairwiseDistance: forward(x) with x %s alone: it takes two inputs, "
                      "(x1, x2)", shape_str(x.shape()).c_str()));
}
Tensor CosineSimilarity::operator()(const Tensor& x1, const Tensor& x2, Loc loc) {
    return functional::cosine_similarity(x1, x2, dim, eps, loc);
}
Tensor CosineSimilarity::forward(const Tensor& x) {
    detail::fail(strf("CosineSimilarity: forward(x) with x %s alone: it takes two inputs, "
                      "(x1, x2)", shape_str(x.shape()).c_str()));
}
Tensor Softmin::forward(const Tensor& x) { return functional::softmin(x, dim); }
PReLU::PReLU(int64_t num_parameters, double init, Loc loc) {
    detail::UserLocScope at(loc);
    if (num_parameters < 1)
        detail::fail(strf("PReLU: num_parameters must be at least 1, got %lld",
                          (long long)num_parameters));
    weight = Tensor::full({num_parameters}, init).requires_grad();
}
Tensor PReLU::forward(const Tensor& x) { return functional::prelu(x, weight); }

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       Loc loc) {
    detail::UserLocScope at(loc);
    if (!(norm_type > 0))
        detail::fail(strf("clip_grad_norm_: norm_type must be > 0 or INFINITY, got %g",
                          norm_type));
    NoGrad no_grad;
    Tensor norm;
    if (norm_type == 2) {   // one sum of squares: the norms' norm without their roots
        Tensor total = Tensor::zeros({});
        for (const Tensor& p : params)
            if (p.grad().defined()) total = total + p.grad().square().sum();
        norm = total.sqrt();
    } else {
        std::vector<Tensor> norms;
        for (const Tensor& p : params)
            if (p.grad().defined())
                norms.push_back(p.grad().norm(norm_type).cast(DType::FLOAT32));
        norm = norms.empty() ? Tensor::zeros({}) : stack(norms).norm(norm_type);
    }
    Tensor scale = (float(max_norm) / (norm + 1e-6f)).clamp(std::nullopt, 1.0);
    for (const Tensor& p : params)
        if (Tensor g = p.grad(); g.defined()) p.node()->grad = (g * scale).cast(g.dtype()).node();
    return norm;
}
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value, Loc loc) {
    detail::UserLocScope at(loc);
    if (!(clip_value >= 0))
        detail::fail(strf("clip_grad_value_: clip_value must be at least 0, got %g", clip_value));
    NoGrad no_grad;
    for (const Tensor& p : params)
        if (Tensor g = p.grad(); g.defined())
            p.node()->grad = g.clamp(-clip_value, clip_value).node();
}
Tensor parameters_to_vector(const std::vector<Tensor>& params, Loc loc) {
    detail::UserLocScope at(loc);
    if (params.empty()) detail::fail("parameters_to_vector: no parameters");
    std::vector<Tensor> flat;
    for (const Tensor& p : params) flat.push_back(p.reshape({-1}));
    return cat(flat);
}
void vector_to_parameters(const Tensor& vec, const std::vector<Tensor>& params, Loc loc) {
    detail::UserLocScope at(loc);
    int64_t total = 0;
    for (const Tensor& p : params) total += p.numel();
    if (vec.shape() != Shape{total})
        detail::fail(strf("vector_to_parameters: vec %s must be [%lld], the parameters' size",
                          shape_str(vec.shape()).c_str(), (long long)total));
    NoGrad no_grad;
    std::vector<Tensor> copies;
    int64_t at_element = 0;
    for (const Tensor& p : params) {
        Tensor piece = vec.slice(0, at_element, at_element + p.numel()).reshape(p.shape());
        copies.push_back(p.assign(piece.cast(p.dtype())));
        at_element += p.numel();
    }
    tg::realize(copies);
}

namespace functional {
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Loc loc) {
    detail::UserLocScope at(loc);
    Tensor y = x.matmul(weight.mT());
    return bias.defined() ? y + bias : y;
}
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  Loc loc) {
    const Shape& xs = detail::check_defined(x, "layer_norm", loc).shape();
    if (xs.empty()) detail::fail("layer_norm: x is a scalar; it has no axis to normalize", loc);
    return layer_norm(x, Shape{xs.back()}, weight, bias, eps, loc);
}
// x's last axes, normalized_shape, checked, with the weight and bias (where given), which must
// broadcast to x's shape and leave it unchanged (normalized_shape itself, or less)
static std::vector<int> normalized_axes(const char* op, const Tensor& x,
                                        const Shape& normalized_shape, const Tensor& weight,
                                        const Tensor& bias, Loc loc) {
    const Shape& xs = detail::check_defined(x, op, loc).shape();
    size_t k = normalized_shape.size();
    if (k == 0 || k > xs.size() || !std::equal(normalized_shape.begin(), normalized_shape.end(),
                                               xs.end() - ptrdiff_t(k)))
        detail::fail(strf("%s: x %s does not end in normalized_shape %s", op,
                          shape_str(xs).c_str(), shape_str(normalized_shape).c_str()));
    for (const Tensor* t : {&weight, &bias})
        if (t->defined() && !broadcasts_to(t->shape(), xs))
            detail::fail(strf("%s: %s %s does not fit x %s (normalized over its last axes, %s)",
                              op, t == &weight ? "weight" : "bias",
                              shape_str(t->shape()).c_str(), shape_str(xs).c_str(),
                              shape_str(normalized_shape).c_str()));
    std::vector<int> axes;
    for (size_t i = 0; i < k; i++) axes.push_back(-1 - int(i));
    return axes;
}
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    std::vector<int> axes = normalized_axes("layer_norm", x, normalized_shape, weight, bias, loc);
    Tensor centered = x - x.mean(axes, true);
    Tensor y = centered * ((centered * centered).mean(axes, true) + eps).rsqrt();
    if (weight.defined()) y = y * weight;
    return bias.defined() ? y + bias : y;
}
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                std::optional<double> eps, Loc loc) {
    detail::UserLocScope at(loc);
    std::vector<int> axes = normalized_axes("rms_norm", x, normalized_shape, weight, Tensor(),
                                            loc);
    if (!dtype_is_float(x.dtype()))
        detail::fail(strf("rms_norm: x must be floating point, got %s", dtype_name(x.dtype())));
    double spacing = x.dtype() == DType::FLOAT64 ? std::numeric_limits<double>::epsilon()
                                                 : std::numeric_limits<float>::epsilon();
    Tensor y = x * ((x * x).mean(axes, true) + eps.value_or(spacing)).rsqrt();
    return weight.defined() ? y * weight : y;
}
// weight and bias [C] seen as [C, 1, ...] against x [N, C, *]
static Tensor per_channel_affine(const char* op, const Tensor& y, const Tensor& weight,
                                 const Tensor& bias) {
    Shape channel(size_t(y.ndim()), 1);
    channel[1] = y.size(1);
    Tensor out = y;
    for (const Tensor* t : {&weight, &bias}) {
        if (!t->defined()) continue;
        if (t->shape() != Shape{y.size(1)})
            detail::fail(strf("%s: %s is %s; x %s has %lld channels", op,
                              t == &weight ? "weight" : "bias", shape_str(t->shape()).c_str(),
                              shape_str(y.shape()).c_str(), (long long)y.size(1)));
        out = t == &weight ? out * t->reshape(channel) : out + t->reshape(channel);
    }
    return out;
}
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps, Loc loc) {
    detail::UserLocScope at(loc);
    if (x.ndim() < 2 || groups <= 0 || x.size(1) % groups != 0)
        detail::fail(strf("group_norm: x %s needs [N, C, *] with C a multiple of groups %lld",
                          shape_str(x.shape()).c_str(), (long long)groups));
    int64_t per_group = x.numel() / std::max<int64_t>(1, x.size(0) * groups);
    Tensor g = x.reshape({x.size(0), groups, per_group});
    Tensor centered = g - g.mean(-1, true);
    Tensor y = centered * ((centered * centered).mean(-1, true) + eps).rsqrt();
    return per_channel_affine("group_norm", y.reshape(x.shape()), weight, bias);
}
// running_mean and running_var [C] (where given) moved toward a batch's mean and biased
// variance (any shape of C elements; made unbiased by n/(n - 1), n the values behind each), by
// momentum or by 1 / batches, read from the count when the program runs. The updates (and the
// count's) are realized at once, with x: they must not wait for the output, which may never be
// realized, and x would be computed twice apart.
static void move_running_statistics(const Tensor& running_mean, const Tensor& running_var,
                                    const Tensor& mean, const Tensor& var, int64_t n,
                                    std::optional<double> momentum, const Tensor& count,
                                    const Tensor& x) {
    std::vector<Tensor> updates;
    {
        NoGrad no_grad;
        double unbiased = double(n) / double(n - 1);
        auto moved = [&](const Tensor& r, const Tensor& batch, double scale) {
            Tensor b = batch.detach().reshape({r.numel()});
            if (momentum) return r * (1 - *momentum) + b * (*momentum * scale);
            Tensor share = 1.0f / (count + 1).cast(DType::FLOAT32);
            return r * (1 - share) + b * (share * scale);
        };
        if (running_mean.defined())
            updates.push_back(running_mean.assign(moved(running_mean, mean, 1)));
        if (running_var.defined())
            updates.push_back(running_var.assign(moved(running_var, var, unbiased)));
        if (count.defined()) updates.push_back(count.assign(count + 1));
    }
    if (updates.empty()) return;
    updates.push_back(x);
    tg::realize(updates);
}
// count (int64, realized; nn::BatchNorm's) gains 1 while training. momentum std::nullopt:
// 1 / (count + 1), the mean of every batch so far.
static Tensor batch_norm_counted(const Tensor& x, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& weight,
                                 const Tensor& bias, bool training,
                                 std::optional<double> momentum, double eps,
                                 const Tensor& count, Loc loc) {
    detail::UserLocScope at(loc);
    if (x.ndim() < 2 || !dtype_is_float(x.dtype()))
        detail::fail(strf("batch_norm: x %s %s needs a float [N, C, *]", dtype_name(x.dtype()),
                          shape_str(x.shape()).c_str()));
    int64_t channels = x.size(1), per_channel = x.numel() / std::max<int64_t>(1, channels);
    for (const Tensor* t : {&running_mean, &running_var})
        if (t->defined() && t->shape() != Shape{channels})
            detail::fail(strf("batch_norm: %s is %s; x %s has %lld channels",
                              t == &running_mean ? "running_mean" : "running_var",
                              shape_str(t->shape()).c_str(), shape_str(x.shape()).c_str(),
                              (long long)channels));
    Shape channel(size_t(x.ndim()), 1);
    channel[1] = channels;
    if (!training) {
        if (!running_mean.defined() || !running_var.defined())
            detail::fail("batch_norm: evaluating needs running_mean and running_var");
        Tensor y = (x - running_mean.reshape(channel)) *
                   (running_var.reshape(channel) + eps).rsqrt();
        return per_channel_affine("batch_norm", y, weight, bias);
    }
    if (per_channel <= 1)
        detail::fail(strf("batch_norm: training needs more than 1 value per channel, x is %s",
                          shape_str(x.shape()).c_str()));
    std::vector<int> axes;
    for (int a = 0; a < x.ndim(); a++)
        if (a != 1) axes.push_back(a);
    Tensor mean = x.mean(axes, true), centered = x - mean;
    Tensor var = (centered * centered).mean(axes, true);
    Tensor y = per_channel_affine("batch_norm", centered * (var + eps).rsqrt(), weight, bias);
    move_running_statistics(running_mean, running_var, mean, var, per_channel, momentum, count,
                            x);
    return y;
}
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps, Loc loc) {
    return batch_norm_counted(x, running_mean, running_var, weight, bias, training, momentum,
                              eps, Tensor(), loc);
}
Tensor instance_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool use_input_stats,
                     double momentum, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(x, "instance_norm", loc);
    if (x.ndim() < 3 || !dtype_is_float(x.dtype()))
        detail::fail(strf("instance_norm: x %s %s needs a float [N, C, *spatial]",
                          dtype_name(x.dtype()), shape_str(x.shape()).c_str()));
    const int64_t channels = x.size(1);
    const int64_t positions = x.numel() / std::max<int64_t>(1, x.size(0) * channels);
    for (const Tensor* t : {&running_mean, &running_var})
        if (t->defined() && t->shape() != Shape{channels})
            detail::fail(strf("instance_norm: %s is %s; x %s has %lld channels",
                              t == &running_mean ? "running_mean" : "running_var",
                              shape_str(t->shape()).c_str(), shape_str(x.shape()).c_str(),
                              (long long)channels));
    if (!use_input_stats) {
        if (!running_mean.defined() || !running_var.defined())
            detail::fail("instance_norm: without use_input_stats it needs running_mean and "
                         "running_var");
        Shape channel(size_t(x.ndim()), 1);
        channel[1] = channels;
        Tensor y = (x - running_mean.reshape(channel)) *
                   (running_var.reshape(channel) + eps).rsqrt();
        return per_channel_affine("instance_norm", y, weight, bias);
    }
    if (positions <= 1)
        detail::fail(strf("instance_norm: x %s has 1 position per channel; its statistics need "
                          "more", shape_str(x.shape()).c_str()));
    std::vector<int> axes;
    for (int a = 2; a < x.ndim(); a++) axes.push_back(a);
    Tensor mean = x.mean(axes, true), centered = x - mean;
    Tensor var = (centered * centered).mean(axes, true);
    Tensor y = per_channel_affine("instance_norm", centered * (var + eps).rsqrt(), weight, bias);
    move_running_statistics(running_mean, running_var, mean.mean(0), var.mean(0), positions,
                            momentum, Tensor(), x);
    return y;
}
// the squares padded with zeros along the channels, their sum over each window of size
// channels a sum of size shifted views
Tensor local_response_norm(const Tensor& x, int64_t size, double alpha, double beta, double k,
                           Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(x, "local_response_norm", loc);
    if (x.ndim() < 3 || !dtype_is_float(x.dtype()))
        detail::fail(strf("local_response_norm: x %s %s needs a float [N, C, *]",
                          dtype_name(x.dtype()), shape_str(x.shape()).c_str()));
    if (size < 1)
        detail::fail(strf("local_response_norm: size must be at least 1, got %lld",
                          (long long)size));
    const int64_t channels = x.size(1);
    std::vector<std::pair<int64_t, int64_t>> pads(size_t(x.ndim()), {0, 0});
    pads[1] = {size / 2, (size - 1) / 2};
    Tensor squares = (x * x).pad(pads, 0);
    Tensor window_sum = squares.slice(1, 0, channels);
    for (int64_t i = 1; i < size; i++) window_sum = window_sum + squares.slice(1, i, i + channels);
    return x / (window_sum * (alpha / double(size)) + k).pow(beta);
}
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal, Loc loc) {
    detail::UserLocScope at(loc);
    return detail::attention_weights(q, k, is_causal, loc).matmul(v);
}
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Loc loc) {
    detail::UserLocScope at(loc);
    if (attn_mask.defined() && is_causal)
        detail::fail("scaled_dot_product_attention: attn_mask and is_causal together; the "
                     "mask can hold the causal one", loc);
    Tensor weights = detail::attention_weights(q, k, is_causal, loc, attn_mask, scale);
    return dropout(weights, dropout_p, true, Tensor::next_seed(), loc).matmul(v);
}

// Convolution and pooling read x through one strided view per position of the kernel: the
// view at position (k_1, ...) holds, for every window, the element of x at that position in
// the window, so a window's elements are the same element of each view. A convolution is then
// a sum over positions of products (each position's weights with its view: the loop compiler
// joins them into one product); pooling takes the largest or the mean of each window's
// elements, gathered along a last axis (pooling_windows). Along an axis, window o starts at
// o·stride and its position k is at k·dilation.
namespace {
// sizes for each of `axes` spatial axes, each at least `least`
std::vector<int64_t> per_axis(const SpatialSizes& given, size_t axes, const char* op,
                              const char* what, int64_t least) {
    std::vector<int64_t> sizes = given.sizes;
    if (sizes.size() == 1) sizes.assign(axes, sizes[0]);
    bool fits = sizes.size() == axes;
    for (int64_t n : sizes) fits = fits && n >= least;
    if (!fits)
        detail::fail(strf("%s: %s must be %zu size%s, each at least %lld (one for every axis "
                          "or one per axis), got %s",
                          op, what, axes, axes > 1 ? "s" : "", (long long)least,
                          shape_str(given.sizes).c_str()));
    return sizes;
}
struct Windows {
    std::vector<Tensor> views;   // one per position of the kernel, in row-major order
    Shape counts;                // windows along each spatial axis
};
// The windows along x's last kernel.size() axes, padded already
Shape window_counts(const Tensor& x, const std::vector<int64_t>& kernel,
                    const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation,
                    const char* op, const Shape& unpadded) {
    const size_t axes = kernel.size(), first = size_t(x.ndim()) - axes;
    Shape counts;
    for (size_t a = 0; a < axes; a++) {
        int64_t span = dilation[a] * (kernel[a] - 1) + 1;
        if (x.shape()[first + a] < span)
            detail::fail(strf("%s: input %s, padded %s, is smaller than the kernel %s (dilated "
                              "%s)", op, shape_str(unpadded).c_str(),
                              shape_str(x.shape()).c_str(), shape_str(kernel).c_str(),
                              shape_str(dilation).c_str()));
        counts.push_back((x.shape()[first + a] - span) / stride[a] + 1);
    }
    return counts;
}
Windows windows_of(const Tensor& x, const std::vector<int64_t>& kernel,
                   const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation,
                   const char* op, const Shape& unpadded) {
    const size_t axes = kernel.size(), first = size_t(x.ndim()) - axes;
    Windows w;
    w.counts = window_counts(x, kernel, stride, dilation, op, unpadded);
    int64_t positions = 1;
    for (int64_t k : kernel) positions *= k;
    for (int64_t p = 0; p < positions; p++) {
        Tensor view = x;
        for (size_t a = axes, rest = size_t(p); a-- > 0; rest /= size_t(kernel[a])) {
            int64_t start = int64_t(rest % size_t(kernel[a])) * dilation[a];
            view = view.slice(int(first + a), start, start + (w.counts[a] - 1) * stride[a] + 1,
                              stride[a]);
        }
        w.views.push_back(view);
    }
    return w;
}
// x padded by `padding` on both sides of its last padding.size() axes
Tensor pad_spatial(const Tensor& x, const std::vector<int64_t>& padding, double value) {
    std::vector<std::pair<int64_t, int64_t>> pads(size_t(x.ndim()), {0, 0});
    for (size_t a = 0; a < padding.size(); a++)
        pads[pads.size() - padding.size() + a] = {padding[a], padding[a]};
    return x.pad(pads, value);
}
std::string conv_shapes(const Tensor& input, const Tensor& weight) {
    return strf("input %s, weight %s", shape_str(input.shape()).c_str(),
                shape_str(weight.shape()).c_str());
}
// input [N, C_in, *spatial] (N added where it is missing) and weight [a, b, *kernel] checked;
// the message names the weight's first axes (weight_axes)
Tensor conv_input(const char* op, size_t axes, const Tensor& input, const Tensor& weight,
                  const char* weight_axes) {
    bool batched = size_t(input.ndim()) == axes + 2;
    if (!batched && size_t(input.ndim()) != axes + 1)
        detail::fail(strf("%s: input must be [N, C_in, %zu spatial axes] or [C_in, ...]; %s", op,
                          axes, conv_shapes(input, weight).c_str()));
    if (size_t(weight.ndim()) != axes + 2)
        detail::fail(strf("%s: weight must be [%s, %zu kernel axes]; %s", op, weight_axes, axes,
                          conv_shapes(input, weight).c_str()));
    return batched ? input : input.unsqueeze(0);
}
// y [N, C_out, *spatial] plus bias [C_out] along its channels, where a bias is given
Tensor plus_channel_bias(const char* op, const Tensor& y, const Tensor& bias) {
    if (!bias.defined()) return y;
    if (bias.shape() != Shape{y.size(1)})
        detail::fail(strf("%s: bias must be [C_out] = [%lld], got %s", op, (long long)y.size(1),
                          shape_str(bias.shape()).c_str()));
    Shape along_channels(size_t(y.ndim()), 1);
    along_channels[1] = y.size(1);
    return y + bias.reshape(along_channels);
}
// A convolution's padding (before, after) along each spatial axis
std::vector<std::pair<int64_t, int64_t>> conv_pads(const char* op, const ConvPadding& padding,
                                                   const std::vector<int64_t>& kernel,
                                                   const std::vector<int64_t>& stride,
                                                   const std::vector<int64_t>& dilation) {
    const size_t axes = kernel.size();
    std::vector<std::pair<int64_t, int64_t>> pads;
    if (padding.rule.empty())
        for (int64_t p : per_axis(padding, axes, op, "padding", 0)) pads.push_back({p, p});
    else if (padding.rule == "valid")
        pads.assign(axes, {0, 0});
    else if (padding.rule != "same")
        detail::fail(strf("%s: padding \"%s\" is not \"valid\", \"same\" or sizes", op,
                          padding.rule.c_str()));
    for (size_t a = 0; a < axes && padding.rule == "same"; a++) {
        if (stride[a] != 1)
            detail::fail(strf("%s: padding \"same\" needs stride 1, got stride %s", op,
                              shape_str(stride).c_str()));
        const int64_t total = dilation[a] * (kernel[a] - 1);
        pads.push_back({total / 2, total - total / 2});
    }
    return pads;
}
Tensor convolution(const char* op, size_t axes, const Tensor& input, const Tensor& weight,
                   const Tensor& bias, const SpatialSizes& stride_given,
                   const ConvPadding& padding_given, const SpatialSizes& dilation_given,
                   int64_t groups, Loc loc) {
    detail::UserLocScope at(loc);
    auto shapes = [&] { return conv_shapes(input, weight); };
    Tensor x = conv_input(op, axes, input, weight, "C_out, C_in / groups");
    bool batched = x.ndim() == input.ndim();
    const int64_t n = x.size(0), c_in = x.size(1), c_out = weight.size(0);
    if (groups < 1 || c_in % groups || c_out % groups || weight.size(1) != c_in / groups)
        detail::fail(strf("%s: %s, groups %lld: C_in and C_out must divide by groups, and the "
                          "weight's axis 1 be C_in / groups", op, shapes().c_str(),
                          (long long)groups));
    std::vector<int64_t> kernel(weight.shape().begin() + 2, weight.shape().end());
    for (int64_t k : kernel)
        if (k < 1) detail::fail(strf("%s: the kernel is empty; %s", op, shapes().c_str()));
    std::vector<int64_t> stride = per_axis(stride_given, axes, op, "stride", 1);
    std::vector<int64_t> dilation = per_axis(dilation_given, axes, op, "dilation", 1);
    std::vector<std::pair<int64_t, int64_t>> pads(size_t(x.ndim()), {0, 0});
    std::vector<std::pair<int64_t, int64_t>> spatial_pads =
        conv_pads(op, padding_given, kernel, stride, dilation);
    std::copy(spatial_pads.begin(), spatial_pads.end(), pads.end() - long(axes));
    Windows w = windows_of(x.pad(pads, 0), kernel, stride, dilation, op, x.shape());
    // each position's product: x [n, group, c, *windows] · w [group, o, c]
    const std::string spatial = std::string("xyz").substr(0, axes);
    const std::string spec = "ngc" + spatial + ",goc->ngo" + spatial;
    Shape grouped = {n, groups, c_in / groups};
    grouped.insert(grouped.end(), w.counts.begin(), w.counts.end());
    const int64_t positions = int64_t(w.views.size());
    Tensor by_position = weight.reshape({c_out, c_in / groups, positions});
    Tensor y;
    for (int64_t p = 0; p < positions; p++) {
        Tensor term = einsum(spec, {w.views[size_t(p)].reshape(grouped),
                                    by_position.slice(2, p, p + 1)
                                        .reshape({groups, c_out / groups, c_in / groups})});
        y = p ? y + term : term;
    }
    Shape out = {n, c_out};
    out.insert(out.end(), w.counts.begin(), w.counts.end());
    y = plus_channel_bias(op, y.reshape(out), bias);
    return batched ? y : y.squeeze(0);
}
void check_pooling_input(const char* op, size_t axes, const Tensor& x) {
    if (size_t(x.ndim()) != axes + 1 && size_t(x.ndim()) != axes + 2)
        detail::fail(strf("%s: input must be [N, C, %zu spatial axes] or [C, ...], got %s", op,
                          axes, shape_str(x.shape()).c_str()));
    if (!dtype_is_float(x.dtype()))
        detail::fail(strf("%s: input must be floating point, got %s", op,
                          dtype_name(x.dtype())));
}
// A pooling's input checked, its sizes per axis, and x padded with pad_value: by padding on
// both sides, then after it by beyond, ceil_mode's room for a last window cut short
struct Pooling {
    Tensor padded;
    std::vector<int64_t> kernel, stride, dilation, padding, beyond;
    double pad_value;
};
Tensor pooling_padded(const Tensor& x, const Pooling& p, double value, double beyond_value) {
    Tensor padded = pad_spatial(x, p.padding, value);
    if (std::all_of(p.beyond.begin(), p.beyond.end(), [](int64_t b) { return b == 0; }))
        return padded;
    std::vector<std::pair<int64_t, int64_t>> pads(size_t(x.ndim()), {0, 0});
    for (size_t a = 0; a < p.beyond.size(); a++)
        pads[pads.size() - p.beyond.size() + a].second = p.beyond[a];
    return padded.pad(pads, beyond_value);
}
Pooling pooling_input(const char* op, size_t axes, const Tensor& x,
                      const SpatialSizes& kernel_given, const SpatialSizes& stride_given,
                      const SpatialSizes& padding_given, const SpatialSizes& dilation_given,
                      double pad_value, bool ceil_mode) {
    check_pooling_input(op, axes, x);
    Pooling p;
    p.kernel = per_axis(kernel_given, axes, op, "kernel_size", 1);
    p.stride = stride_given.sizes.empty() ? p.kernel
                                          : per_axis(stride_given, axes, op, "stride", 1);
    p.padding = per_axis(padding_given, axes, op, "padding", 0);
    p.dilation = per_axis(dilation_given, axes, op, "dilation", 1);
    p.beyond.assign(axes, 0);
    for (size_t a = 0; a < axes; a++) {
        if (2 * p.padding[a] > p.kernel[a])   // else a window could lie in the padding alone
            detail::fail(strf("%s: padding %s must be at most half the kernel %s", op,
                              shape_str(p.padding).c_str(), shape_str(p.kernel).c_str()));
        const int64_t size = x.shape()[size_t(x.ndim()) - axes + a];
        const int64_t length = size + 2 * p.padding[a];
        const int64_t span = p.dilation[a] * (p.kernel[a] - 1) + 1, stride = p.stride[a];
        if (!ceil_mode || length < span) continue;   // (too short: window_counts says so)
        int64_t windows = (length - span + stride - 1) / stride + 1;
        if ((windows - 1) * stride >= size + p.padding[a]) windows--;
        p.beyond[a] = std::max<int64_t>(0, (windows - 1) * stride + span - length);
    }
    p.padded = pooling_padded(x, p, pad_value, pad_value);
    p.pad_value = pad_value;
    return p;
}
// The windows of a pooling over x's last axes: [..., *windows, the kernel's positions].
// Windows apart from each other (each stride at least its kernel, no dilation: 2 x 2 windows
// of stride 2) are one view of x: each axis cut into rows of a stride, of which the first
// kernel elements count, the kernel's axes then moved last and joined. Others are the views
// of the kernel's positions, stacked (a gradient through them adds as many padded copies as
// the kernel has positions).
Tensor pooling_windows(const char* op, const Tensor& x, const Pooling& p) {
    const size_t axes = p.kernel.size();
    const std::vector<int64_t>&kernel = p.kernel, &stride = p.stride, &dilation = p.dilation;
    const Tensor& padded = p.padded;
    bool apart = true;
    for (size_t a = 0; a < axes; a++) apart = apart && dilation[a] == 1 && stride[a] >= kernel[a];
    if (!apart)
        return stack(windows_of(padded, kernel, stride, dilation, op, x.shape()).views, -1);
    Shape counts = window_counts(padded, kernel, stride, dilation, op, x.shape());
    const int lead = int(x.ndim() - int64_t(axes));
    Tensor cut = padded;
    for (int a = int(axes) - 1; a >= 0; a--) {   // the axes after a keep their places
        const int at = lead + a;
        const int64_t rows = counts[size_t(a)] * stride[size_t(a)], size = cut.size(at);
        std::vector<std::pair<int64_t, int64_t>> fit(size_t(cut.ndim()), {0, 0});
        fit[size_t(at)] = {0, rows - size};   // the last row's end lies past every window
        if (rows < size) cut = cut.slice(at, 0, rows);
        if (rows > size) cut = cut.pad(fit, p.pad_value);
        Shape split = cut.shape();
        split[size_t(at)] = stride[size_t(a)];
        split.insert(split.begin() + at, counts[size_t(a)]);
        cut = cut.reshape(split).slice(at + 1, 0, kernel[size_t(a)]);
    }
    std::vector<int> order;   // [..., w0, k0, w1, k1, ...] to [..., w0, w1, ..., k0, k1, ...]
    for (int i = 0; i < lead; i++) order.push_back(i);
    for (int odd = 0; odd < 2; odd++)
        for (int a = 0; a < int(axes); a++) order.push_back(lead + 2 * a + odd);
    Shape joined(x.shape().begin(), x.shape().begin() + lead);
    joined.insert(joined.end(), counts.begin(), counts.end());
    joined.push_back(-1);
    return cut.permute(order).reshape(joined);
}
// max_pool's values and, with_indices, where each lies in x's spatial axes flattened
ValuesIndices max_pool(const char* op, size_t axes, const Tensor& x, const SpatialSizes& kernel,
                       const SpatialSizes& stride, const SpatialSizes& padding,
                       const SpatialSizes& dilation, bool ceil_mode, bool with_indices,
                       Loc loc) {
    detail::UserLocScope at(loc);
    // Picked by index, so that the gradient goes to one element (the first largest, or the
    // first NaN), as PyTorch's. The index is found elementwise over the kernel's positions, a
    // view of x each (a row of windows is a strided row of x, so the loops vectorize), not
    // as an argmax along the windows' last axis (two passes over each window's few
    // elements): C1's step took 31.1 ms with the argmax, 28.5 so (bench/HISTORY.md).
    Pooling p = pooling_input(op, axes, x, kernel, stride, padding, dilation, -INFINITY,
                              ceil_mode);
    std::vector<Tensor> views =
        windows_of(p.padded, p.kernel, p.stride, p.dilation, op, x.shape()).views;
    Tensor best = views[0].detach();
    for (size_t i = 1; i < views.size(); i++) best = best.maximum(views[i].detach());
    Tensor first = Tensor::full(best.shape(), int(views.size() - 1), DType::INT32);
    for (size_t i = views.size() - 1; i-- > 0;) {
        Tensor v = views[i].detach();
        first = where((v == best).maximum(v != v), int(i), first);
    }
    Tensor values = pooling_windows(op, x, p).gather(-1, first.unsqueeze(-1)).squeeze(-1);
    if (!with_indices) return {values, Tensor()};
    // kernel position first (row-major over the kernel's axes) to x's coordinates, flattened
    const int lead = x.ndim() - int(axes);
    Tensor position = first.cast(DType::INT64), flat = Tensor::zeros(first.shape(), DType::INT64);
    int64_t inner = 1, plane = 1;
    for (int64_t k : p.kernel) inner *= k;
    for (size_t a = 0; a < axes; a++) plane *= x.size(lead + int(a));
    for (size_t a = 0; a < axes; a++) {
        const int at_axis = lead + int(a);
        inner /= p.kernel[a];
        plane /= x.size(at_axis);
        Shape along(size_t(first.ndim()), 1);
        along[size_t(at_axis)] = first.size(at_axis);
        Tensor origin = Tensor::arange(first.size(at_axis)).cast(DType::INT64) * p.stride[a] -
                        p.padding[a];
        Tensor offset = position.floor_divide(inner) % p.kernel[a] * p.dilation[a];
        flat = flat + (origin.reshape(along) + offset) * plane;
    }
    return {values, flat};
}
// zeros [..., prod(out)] with x written at indices, each flattened over the spatial axes
Tensor max_unpool(const char* op, size_t axes, const Tensor& x, const Tensor& indices,
                  const SpatialSizes& kernel_given, const SpatialSizes& stride_given,
                  const SpatialSizes& padding_given, const SpatialSizes& output_size,
                  Loc loc) {
    detail::UserLocScope at(loc);
    check_pooling_input(op, axes, x);
    if (!indices.defined() || indices.shape() != x.shape() ||
        (indices.dtype() != DType::INT64 && indices.dtype() != DType::INT32))
        detail::fail(strf("%s: indices must be int64 (max_pool's) of x's shape %s, got %s %s", op,
                          shape_str(x.shape()).c_str(),
                          indices.defined() ? dtype_name(indices.dtype()) : "undefined",
                          indices.defined() ? shape_str(indices.shape()).c_str() : ""));
    std::vector<int64_t> kernel = per_axis(kernel_given, axes, op, "kernel_size", 1);
    std::vector<int64_t> stride = stride_given.sizes.empty()
                                      ? kernel
                                      : per_axis(stride_given, axes, op, "stride", 1);
    std::vector<int64_t> padding = per_axis(padding_given, axes, op, "padding", 0);
    const int lead = x.ndim() - int(axes);
    Shape out(x.shape().begin(), x.shape().begin() + lead);
    const std::vector<int64_t>& given = output_size.sizes;
    if (!given.empty() && given.size() != axes && given.size() != size_t(x.ndim()))
        detail::fail(strf("%s: output_size %s must have %zu (or %d) sizes", op,
                          shape_str(given).c_str(), axes, x.ndim()));
    for (size_t a = 0; a < axes; a++) {
        const int64_t windows = x.size(lead + int(a));
        const int64_t natural = (windows - 1) * stride[a] - 2 * padding[a] + kernel[a];
        const int64_t size = given.empty() ? natural : given[given.size() - axes + a];
        if (size < 1 || size < natural - stride[a] || size > natural + stride[a])
            detail::fail(strf("%s: output_size %lld along spatial axis %zu is not within %lld "
                              "± the stride %lld (x %s)", op, (long long)size, a,
                              (long long)natural, (long long)stride[a],
                              shape_str(x.shape()).c_str()));
        out.push_back(size);
    }
    Shape rows(out.begin(), out.begin() + lead);
    rows.push_back(-1);
    Tensor zeros = Tensor::zeros(out, x.dtype()).reshape(rows);
    return zeros.scatter(-1, indices.flatten(lead, -1), x.flatten(lead, -1)).reshape(out);
}
Tensor avg_pool(const char* op, size_t axes, const Tensor& x, const SpatialSizes& kernel,
                const SpatialSizes& stride, const SpatialSizes& padding,
                bool count_include_pad, bool ceil_mode,
                std::optional<int64_t> divisor_override, Loc loc) {
    detail::UserLocScope at(loc);
    if (divisor_override == 0) detail::fail(strf("%s: divisor_override must not be 0", op));
    Pooling p = pooling_input(op, axes, x, kernel, stride, padding, 1, 0, ceil_mode);
    Tensor windows = pooling_windows(op, x, p);
    if (divisor_override) return windows.sum(-1) / double(*divisor_override);
    bool cut_short = std::any_of(p.beyond.begin(), p.beyond.end(), [](int64_t b) { return b; });
    if (count_include_pad && !cut_short) return windows.mean(-1);
    // each window's count: the same windows over ones, padded with ones where the padding
    // counts, with zeros where it does not and beyond it
    Shape one_channel = {1};
    one_channel.insert(one_channel.end(), x.shape().end() - int64_t(axes), x.shape().end());
    Tensor ones = Tensor::ones(one_channel, x.dtype());
    Pooling counted = p;
    counted.padded = pooling_padded(ones, p, count_include_pad ? 1 : 0, 0);
    return windows.sum(-1) / pooling_windows(op, ones, counted).sum(-1);
}
Tensor lp_pool(const char* op, size_t axes, const Tensor& x, double norm_type,
               const SpatialSizes& kernel, const SpatialSizes& stride, bool ceil_mode,
               Loc loc) {
    detail::UserLocScope at(loc);
    if (norm_type == 0) detail::fail(strf("%s: norm_type must not be 0", op));
    Tensor mean = avg_pool(op, axes, x.pow(norm_type), kernel, stride, 0, true, ceil_mode,
                           std::nullopt, loc);
    int64_t positions = 1;
    for (int64_t k : per_axis(kernel, axes, op, "kernel_size", 1)) positions *= k;
    return (mean.sign() * mean.abs().relu() * double(positions)).pow(1 / norm_type);
}
}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, SpatialSizes stride,
              ConvPadding padding, SpatialSizes dilation, int64_t groups, Loc loc) {
    return convolution("conv1d", 1, x, weight, bias, stride, padding, dilation, groups, loc);
}
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, SpatialSizes stride,
              ConvPadding padding, SpatialSizes dilation, int64_t groups, Loc loc) {
    return convolution("conv2d", 2, x, weight, bias, stride, padding, dilation, groups, loc);
}
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, SpatialSizes stride,
              ConvPadding padding, SpatialSizes dilation, int64_t groups, Loc loc) {
    return convolution("conv3d", 3, x, weight, bias, stride, padding, dilation, groups, loc);
}
// A transposed convolution puts x[i]·w[k] at output i·stride - padding + k·dilation. With
// dilation 1, the outputs of one phase (o + padding) mod stride = r take the taps k ≡ r
// alone, at i = m - j for output m·stride + r - padding and tap r + j·stride: an ordinary
// convolution of x with those taps reversed, over m. Each combination of phases is one such
// convolution, and the outputs of the phases are interleaved (stack, reshape) and cut to
// the output's size. Nothing is multiplied by a zero, as it would be in the convolution of x
// with stride - 1 zeros between its elements, which dilations other than 1 still use.
static Tensor convolution_by_phases(const char* op, const Tensor& x, const Tensor& w,
                                    const std::vector<int64_t>& stride,
                                    const std::vector<int64_t>& padding,
                                    const std::vector<int64_t>& out_size, int64_t groups,
                                    Loc loc) {
    const size_t axes = stride.size();
    std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end()), rows(axes);
    for (size_t a = 0; a < axes; a++)   // rows m of every phase, covering padding + out_size
        rows[a] = (padding[a] + out_size[a] + stride[a] - 1) / stride[a];
    std::vector<int64_t> phase(axes);
    std::function<Tensor(size_t)> interleaved = [&](size_t a) -> Tensor {
        if (a < axes) {   // the phases of axis a side by side: [..., rows, stride, ...] merged
            std::vector<Tensor> parts;
            for (phase[a] = 0; phase[a] < stride[a]; phase[a]++)
                parts.push_back(interleaved(a + 1));
            if (parts.size() == 1) return parts[0];
            Tensor joined = stack(parts, int(a) + 3, loc);
            Shape merged = parts[0].shape();
            merged[a + 2] *= stride[a];
            return joined.reshape(merged, loc);
        }
        Shape out = {x.size(0), w.size(0)};
        out.insert(out.end(), rows.begin(), rows.end());
        Tensor taps = w;
        std::vector<std::pair<int64_t, int64_t>> pads(axes + 2, {0, 0});
        std::vector<int> spatial;
        for (size_t b = 0; b < axes; b++) {
            int at = int(b) + 2;
            if (phase[b] >= kernel[b]) return Tensor::zeros(out, x.dtype(), loc);   // no taps
            taps = taps.slice(at, phase[b], kernel[b], stride[b], loc);
            pads[size_t(at)] = {taps.size(at) - 1, std::max<int64_t>(rows[b] - x.size(at), 0)};
            spatial.push_back(at);
        }
        Tensor y = convolution(op, axes, x.pad(pads, 0, loc), taps.flip(spatial, loc), Tensor(),
                               1, 0, 1, groups, loc);
        for (size_t b = 0; b < axes; b++) y = y.slice(int(b) + 2, 0, rows[b], 1, loc);
        return y;
    };
    Tensor y = interleaved(0);
    for (size_t a = 0; a < axes; a++)
        y = y.slice(int(a) + 2, padding[a], padding[a] + out_size[a], 1, loc);
    return y;
}
static Tensor transposed_convolution(const char* op, size_t axes, const Tensor& input,
                                     const Tensor& weight, const Tensor& bias,
                                     const SpatialSizes& stride_given,
                                     const SpatialSizes& padding_given,
                                     const SpatialSizes& output_padding_given, int64_t groups,
                                     const SpatialSizes& dilation_given, Loc loc) {
    detail::UserLocScope at(loc);
    auto shapes = [&] { return conv_shapes(input, weight); };
    Tensor x = conv_input(op, axes, input, weight, "C_in, C_out / groups");
    bool batched = x.ndim() == input.ndim();
    const int64_t c_in = x.size(1), c_out = weight.size(1) * groups;
    if (groups < 1 || c_in % groups || weight.size(0) != c_in)
        detail::fail(strf("%s: %s, groups %lld: the weight's axis 0 must be C_in, and C_in "
                          "divide by groups", op, shapes().c_str(), (long long)groups));
    std::vector<int64_t> kernel(weight.shape().begin() + 2, weight.shape().end());
    std::vector<int64_t> stride = per_axis(stride_given, axes, op, "stride", 1);
    std::vector<int64_t> padding = per_axis(padding_given, axes, op, "padding", 0);
    std::vector<int64_t> extra = per_axis(output_padding_given, axes, op, "output_padding", 0);
    std::vector<int64_t> dilation = per_axis(dilation_given, axes, op, "dilation", 1);
    std::vector<int64_t> out_size;
    for (size_t a = 0; a < axes; a++) {
        int64_t n = x.size(int(a) + 2), k = kernel[a], s = stride[a], d = dilation[a];
        if (extra[a] >= std::max(s, d))
            detail::fail(strf("%s: output_padding %s must be less than the stride %s or the "
                              "dilation %s", op, shape_str(extra).c_str(),
                              shape_str(stride).c_str(), shape_str(dilation).c_str()));
        out_size.push_back((n - 1) * s - 2 * padding[a] + d * (k - 1) + extra[a] + 1);
        if (out_size.back() < 1 || k < 1)
            detail::fail(strf("%s: %s, stride %s, padding %s: the output would be empty", op,
                              shapes().c_str(), shape_str(stride).c_str(),
                              shape_str(padding).c_str()));
    }
    // [C_in, C_out / g, *k] as g groups of [C_out / g, C_in / g, *k]: a convolution's weight
    Shape grouped = {groups, c_in / groups, c_out / groups}, as_conv = {c_out, c_in / groups};
    grouped.insert(grouped.end(), kernel.begin(), kernel.end());
    as_conv.insert(as_conv.end(), kernel.begin(), kernel.end());
    Tensor w = weight.reshape(grouped).transpose(1, 2).reshape(as_conv);
    Tensor y;
    if (std::all_of(dilation.begin(), dilation.end(), [](int64_t d) { return d == 1; })) {
        y = convolution_by_phases(op, x, w, stride, padding, out_size, groups, loc);
    } else {
        std::vector<int> flipped;
        for (size_t a = 0; a < axes; a++) {
            int axis = int(2 + a);
            int64_t n = x.size(axis), s = stride[a];
            if (s > 1 && n > 1) {   // s - 1 zeros after each element, the last one's cut off
                std::vector<std::pair<int64_t, int64_t>> after(size_t(x.ndim()) + 1, {0, 0});
                after[size_t(axis) + 1] = {0, s - 1};
                Shape merged = x.shape();
                merged[size_t(axis)] = n * s;
                x = x.unsqueeze(axis + 1).pad(after).reshape(merged);
                x = x.slice(axis, 0, (n - 1) * s + 1);
            }
            // each side by dilation·(kernel - 1) - padding (+ output_padding after); below 0: cut
            int64_t before = dilation[a] * (kernel[a] - 1) - padding[a], behind = before + extra[a];
            std::vector<std::pair<int64_t, int64_t>> pads(size_t(x.ndim()), {0, 0});
            pads[size_t(axis)] = {std::max<int64_t>(before, 0), std::max<int64_t>(behind, 0)};
            x = x.pad(pads);
            x = x.slice(axis, std::max<int64_t>(-before, 0),
                        x.size(axis) - std::max<int64_t>(-behind, 0));
            flipped.push_back(axis);
        }
        SpatialSizes dilation_sizes;
        dilation_sizes.sizes = dilation;
        y = convolution(op, axes, x, w.flip(flipped), Tensor(), 1, 0, dilation_sizes, groups, loc);
    }
    y = plus_channel_bias(op, y, bias);
    return batched ? y : y.squeeze(0);
}
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        SpatialSizes stride, SpatialSizes padding, SpatialSizes output_padding,
                        int64_t groups, SpatialSizes dilation, Loc loc) {
    return transposed_convolution("conv_transpose1d", 1, x, weight, bias, stride, padding,
                                  output_padding, groups, dilation, loc);
}
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        SpatialSizes stride, SpatialSizes padding, SpatialSizes output_padding,
                        int64_t groups, SpatialSizes dilation, Loc loc) {
    return transposed_convolution("conv_transpose2d", 2, x, weight, bias, stride, padding,
                                  output_padding, groups, dilation, loc);
}
Tensor conv_transpose3d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        SpatialSizes stride, SpatialSizes padding, SpatialSizes output_padding,
                        int64_t groups, SpatialSizes dilation, Loc loc) {
    return transposed_convolution("conv_transpose3d", 3, x, weight, bias, stride, padding,
                                  output_padding, groups, dilation, loc);
}
static const char* const max_pool_names[] = {"", "max_pool1d", "max_pool2d", "max_pool3d"};
static const char* const max_unpool_names[] = {"", "max_unpool1d", "max_unpool2d",
                                               "max_unpool3d"};
static const char* const avg_pool_names[] = {"", "avg_pool1d", "avg_pool2d", "avg_pool3d"};
Tensor max_pool1d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[1], 1, x, kernel_size, stride, padding, dilation, ceil_mode,
                    false, loc).values;
}
ValuesIndices max_pool1d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride, SpatialSizes padding,
                                      SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[1], 1, x, kernel_size, stride, padding, dilation, ceil_mode,
                    true, loc);
}
Tensor max_unpool1d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride, SpatialSizes padding, SpatialSizes output_size,
                    Loc loc) {
    return max_unpool(max_unpool_names[1], 1, x, indices, kernel_size, stride, padding,
                      output_size, loc);
}
Tensor max_pool2d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[2], 2, x, kernel_size, stride, padding, dilation, ceil_mode,
                    false, loc).values;
}
ValuesIndices max_pool2d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride, SpatialSizes padding,
                                      SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[2], 2, x, kernel_size, stride, padding, dilation, ceil_mode,
                    true, loc);
}
Tensor max_unpool2d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride, SpatialSizes padding, SpatialSizes output_size,
                    Loc loc) {
    return max_unpool(max_unpool_names[2], 2, x, indices, kernel_size, stride, padding,
                      output_size, loc);
}
Tensor max_pool3d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[3], 3, x, kernel_size, stride, padding, dilation, ceil_mode,
                    false, loc).values;
}
ValuesIndices max_pool3d_with_indices(const Tensor& x, SpatialSizes kernel_size,
                                      SpatialSizes stride, SpatialSizes padding,
                                      SpatialSizes dilation, bool ceil_mode, Loc loc) {
    return max_pool(max_pool_names[3], 3, x, kernel_size, stride, padding, dilation, ceil_mode,
                    true, loc);
}
Tensor max_unpool3d(const Tensor& x, const Tensor& indices, SpatialSizes kernel_size,
                    SpatialSizes stride, SpatialSizes padding, SpatialSizes output_size,
                    Loc loc) {
    return max_unpool(max_unpool_names[3], 3, x, indices, kernel_size, stride, padding,
                      output_size, loc);
}
Tensor avg_pool1d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, bool count_include_pad, bool ceil_mode,
                  std::optional<int64_t> divisor_override, Loc loc) {
    return avg_pool(avg_pool_names[1], 1, x, kernel_size, stride, padding, count_include_pad,
                    ceil_mode, divisor_override, loc);
}
Tensor avg_pool2d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, bool count_include_pad, bool ceil_mode,
                  std::optional<int64_t> divisor_override, Loc loc) {
    return avg_pool(avg_pool_names[2], 2, x, kernel_size, stride, padding, count_include_pad,
                    ceil_mode, divisor_override, loc);
}
Tensor avg_pool3d(const Tensor& x, SpatialSizes kernel_size, SpatialSizes stride,
                  SpatialSizes padding, bool count_include_pad, bool ceil_mode,
                  std::optional<int64_t> divisor_override, Loc loc) {
    return avg_pool(avg_pool_names[3], 3, x, kernel_size, stride, padding, count_include_pad,
                    ceil_mode, divisor_override, loc);
}
// The windows' views stacked after the channels: [N, C, kernel positions, *windows]
Tensor unfold(const Tensor& x, SpatialSizes kernel_size, SpatialSizes dilation_given,
              SpatialSizes padding_given, SpatialSizes stride_given, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "unfold";
    check_pooling_input(op, 2, x);
    Tensor batched = x.ndim() == 4 ? x : x.unsqueeze(0);
    std::vector<int64_t> kernel = per_axis(kernel_size, 2, op, "kernel_size", 1);
    std::vector<int64_t> dilation = per_axis(dilation_given, 2, op, "dilation", 1);
    std::vector<int64_t> padding = per_axis(padding_given, 2, op, "padding", 0);
    std::vector<int64_t> stride = per_axis(stride_given, 2, op, "stride", 1);
    Windows w = windows_of(pad_spatial(batched, padding, 0), kernel, stride, dilation, op,
                           x.shape());
    Tensor columns = stack(w.views, 2).flatten(1, 2).flatten(2, 3);
    return x.ndim() == 4 ? columns : columns.squeeze(0);
}
// A transposed convolution of the columns, as [N, C·kh·kw, windows], by the identity kernel:
// column element (c, k) goes to output channel c at kernel position k
Tensor fold(const Tensor& x, SpatialSizes output_size, SpatialSizes kernel_size,
            SpatialSizes dilation_given, SpatialSizes padding_given, SpatialSizes stride_given,
            Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "fold";
    detail::check_defined(x, op, loc);
    std::vector<int64_t> out = per_axis(output_size, 2, op, "output_size", 1);
    std::vector<int64_t> kernel = per_axis(kernel_size, 2, op, "kernel_size", 1);
    std::vector<int64_t> dilation = per_axis(dilation_given, 2, op, "dilation", 1);
    std::vector<int64_t> padding = per_axis(padding_given, 2, op, "padding", 0);
    std::vector<int64_t> stride = per_axis(stride_given, 2, op, "stride", 1);
    const int64_t positions = kernel[0] * kernel[1];
    Shape windows;
    std::vector<int64_t> extra;
    for (size_t a = 0; a < 2; a++) {
        int64_t reach = out[a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1;
        windows.push_back(reach < 0 ? 0 : reach / stride[a] + 1);
        extra.push_back(reach < 0 ? 0 : reach % stride[a]);
    }
    Tensor batched = x.ndim() == 3 ? x : x.unsqueeze(0);
    if ((x.ndim() != 2 && x.ndim() != 3) || batched.size(1) % positions ||
        batched.size(2) != windows[0] * windows[1] || windows[0] * windows[1] == 0)
        detail::fail(strf("fold: x %s needs [N, C·%lld, %lld] (or unbatched) for output_size "
                          "%s, kernel %s, dilation %s, padding %s, stride %s",
                          shape_str(x.shape()).c_str(), (long long)positions,
                          (long long)(windows[0] * windows[1]), shape_str(out).c_str(),
                          shape_str(kernel).c_str(), shape_str(dilation).c_str(),
                          shape_str(padding).c_str(), shape_str(stride).c_str()));
    const int64_t n = batched.size(0), channels = batched.size(1) / positions;
    Tensor k = Tensor::arange(positions);
    Tensor identity = (k.reshape({positions, 1}) == k.reshape({1, positions})).cast(x.dtype());
    Tensor weight = identity.reshape({1, positions, 1, kernel[0], kernel[1]})
                        .expand({channels, positions, 1, kernel[0], kernel[1]})
                        .reshape({channels * positions, 1, kernel[0], kernel[1]});
    auto sizes = [](const std::vector<int64_t>& v) {
        SpatialSizes s;
        s.sizes = v;
        return s;
    };
    Tensor y = transposed_convolution(op, 2, batched.reshape({n, channels * positions,
                                                              windows[0], windows[1]}),
                                      weight, Tensor(), sizes(stride), sizes(padding),
                                      sizes(extra), channels, sizes(dilation), loc);
    return x.ndim() == 3 ? y : y.squeeze(0);
}
Tensor lp_pool1d(const Tensor& x, double norm_type, SpatialSizes kernel_size,
                 SpatialSizes stride, bool ceil_mode, Loc loc) {
    return lp_pool("lp_pool1d", 1, x, norm_type, kernel_size, stride, ceil_mode, loc);
}
Tensor lp_pool2d(const Tensor& x, double norm_type, SpatialSizes kernel_size,
                 SpatialSizes stride, bool ceil_mode, Loc loc) {
    return lp_pool("lp_pool2d", 2, x, norm_type, kernel_size, stride, ceil_mode, loc);
}
// Along each spatial axis, x seen as [..., out, n] where mask says which of the n inputs are in
// each bin (j is in bin i when i·n < (j + 1)·out and j·out < (i + 1)·n: integers, no division),
// summed and divided by the bin's count, or its largest taken. A select, not a product with a
// 0/1 matrix: an ∞ in one bin stays out of the others. The largest is taken along the last
// axis first, so that its gradient goes to the first largest in row-major order.
static Tensor adaptive_pool(const char* op, size_t axes, const Tensor& x,
                            const SpatialSizes& output_size, bool largest, Loc loc) {
    detail::UserLocScope at(loc);
    check_pooling_input(op, axes, x);
    std::vector<int64_t> outs = per_axis(output_size, axes, op, "output_size", 1);
    Tensor y = x;
    for (size_t step = 0; step < axes; step++) {
        size_t a = largest ? axes - 1 - step : step;
        int axis = x.ndim() - int(axes) + int(a);
        int64_t n = x.size(axis), out = outs[a];
        Tensor i = Tensor::arange(out).reshape({out, 1}), j = Tensor::arange(n).reshape({1, n});
        Tensor mask = (i * n < (j + 1) * out).minimum(j * out < (i + 1) * n);
        Tensor along = y.transpose(axis, -1).unsqueeze(-2);
        Tensor pooled = largest ? Tensor(where(mask, along, -INFINITY).max(-1))
                                : where(mask, along, 0).sum(-1) / mask.sum(-1).cast(x.dtype());
        y = pooled.transpose(axis, -1);
    }
    return y;
}
Tensor adaptive_avg_pool1d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_avg_pool1d", 1, x, output_size, false, loc);
}
Tensor adaptive_avg_pool2d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_avg_pool2d", 2, x, output_size, false, loc);
}
Tensor adaptive_avg_pool3d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_avg_pool3d", 3, x, output_size, false, loc);
}
Tensor adaptive_max_pool1d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_max_pool1d", 1, x, output_size, true, loc);
}
Tensor adaptive_max_pool2d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_max_pool2d", 2, x, output_size, true, loc);
}
Tensor adaptive_max_pool3d(const Tensor& x, SpatialSizes output_size, Loc loc) {
    return adaptive_pool("adaptive_max_pool3d", 3, x, output_size, true, loc);
}
// One axis at a time (for bilinear and trilinear: the last, then the one before, as PyTorch
// weighs them), through index_select of whole rows. scale: in/out, or 1/scale_factor where
// one was given.
static Tensor resize(const char* op, const Tensor& x, const std::vector<int64_t>& sizes,
                     const std::vector<double>& scales, const std::string& mode,
                     bool align_corners, Loc loc) {
    detail::UserLocScope at(loc);
    const size_t axes = sizes.size();
    bool cubic = mode == "bicubic", nearest = mode == "nearest" || mode == "nearest-exact";
    bool linear = mode == "linear" || mode == "bilinear" || mode == "trilinear";
    if (!linear && !nearest && !cubic && mode != "area")
        detail::fail(strf("%s: mode \"%s\" is not one of nearest, nearest-exact, linear, "
                          "bilinear, bicubic, trilinear, area", op, mode.c_str()));
    size_t needs = mode == "linear" ? 1 : mode == "trilinear" ? 3 : linear || cubic ? 2 : axes;
    if (axes != needs)
        detail::fail(strf("%s: mode %s needs %zu spatial axes, x %s has %zu", op, mode.c_str(),
                          needs, shape_str(x.shape()).c_str(), axes));
    if (align_corners && !linear && !cubic)
        detail::fail(strf("%s: align_corners is for linear, bilinear, bicubic and trilinear, "
                          "not %s", op, mode.c_str()));
    if (mode == "area") {
        SpatialSizes out;
        out.sizes = sizes;
        return adaptive_pool(op, axes, x, out, false, loc);
    }
    if (!dtype_is_float(x.dtype()))
        detail::fail(strf("%s: input must be floating point, got %s", op, dtype_name(x.dtype())));
    Tensor y = x;
    for (size_t a = axes; a-- > 0;) {
        int axis = x.ndim() - int(axes) + int(a);
        int64_t in = x.size(axis), out = sizes[a];
        double scale = align_corners ? (out > 1 ? double(in - 1) / double(out - 1) : 0.0)
                                     : scales[a] > 0 ? 1 / scales[a] : double(in) / double(out);
        // Enlarged k times, k a power of two: ⌊o/k⌋ and ⌊(o + 1/2)/k⌋ are both o >> log2 k, so
        // each input repeats k times, a view whose gradient sums the copies (not a scatter)
        int64_t factor = out / in;
        if (nearest && out == factor * in && factor > 1 && (factor & (factor - 1)) == 0 &&
            scale == 1.0 / double(factor)) {
            Shape one = y.shape(), copies = one, merged = one;
            one.insert(one.begin() + axis + 1, 1);
            copies.insert(copies.begin() + axis + 1, factor);
            merged[size_t(axis)] = out;
            y = y.reshape(one).expand(copies).reshape(merged);
            continue;
        }
        Tensor o = Tensor::arange(out).cast(x.dtype());   // positions in x's precision
        if (nearest) {
            Tensor src = mode == "nearest" ? o * scale : (o + 0.5) * scale;
            Tensor index = src.floor().cast(DType::INT64).minimum(in - 1);
            y = y.index_select(axis, index);
            continue;
        }
        Shape along(size_t(x.ndim()), 1);
        along[size_t(axis)] = out;
        if (cubic) {   // PyTorch's weights, in its order; sources past an edge read the edge
            Tensor src = align_corners ? o * scale : (o + 0.5) * scale - 0.5;
            Tensor first = src.floor(), t = src - first, base = first.cast(DType::INT64);
            const double A = -0.75;
            auto near = [&](const Tensor& d) { return ((A + 2) * d - (A + 3)) * d * d + 1; };
            auto far = [&](const Tensor& d) { return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A; };
            Tensor w[4] = {far(t + 1), near(t), near(1 - t), far((1 - t) + 1)};
            Tensor sum;
            for (int k = 0; k < 4; k++) {
                Tensor at = (base + (k - 1)).maximum(0).minimum(in - 1);
                Tensor term = y.index_select(axis, at) * w[k].reshape(along);
                sum = k ? sum + term : term;
            }
            y = sum;
            continue;
        }
        Tensor src = align_corners ? o * scale : ((o + 0.5) * scale - 0.5).maximum(0.0);
        Tensor low = src.floor().cast(DType::INT64).minimum(in - 1);
        Tensor high = (low + 1).minimum(in - 1);
        Tensor w_high = (src - low.cast(x.dtype())).reshape(along), w_low = 1.0 - w_high;
        y = y.index_select(axis, low) * w_low + y.index_select(axis, high) * w_high;
    }
    return y;
}
Tensor interpolate(const Tensor& x, SpatialSizes size, const std::string& mode,
                   bool align_corners, Loc loc) {
    const size_t axes = size_t(std::max(x.ndim() - 2, 1));
    if (x.ndim() < 2 || (size.sizes.size() > 1 && size.sizes.size() + 2 != size_t(x.ndim())))
        detail::fail(strf("interpolate: x %s needs [N, C, *spatial], one size for each spatial "
                          "axis (or one for all), got %s", shape_str(x.shape()).c_str(),
                          shape_str(size.sizes).c_str()));
    std::vector<int64_t> sizes = per_axis(size, axes, "interpolate", "size", 1);
    return resize("interpolate", x, sizes, std::vector<double>(axes, 0.0), mode, align_corners,
                  loc);
}
static Tensor resize_by(const char* op, const Tensor& x, const ScaleFactor& scale_factor,
                        const std::string& mode, bool align_corners, bool recompute, Loc loc) {
    const size_t axes = size_t(std::max(x.ndim() - 2, 1));
    std::vector<double> scales = scale_factor.factors;
    if (scales.size() == 1) scales.assign(axes, scales[0]);
    bool fits = x.ndim() >= 2 && scales.size() == axes;
    for (double s : scales) fits = fits && s > 0 && std::isfinite(s);
    std::vector<int64_t> sizes;
    for (size_t a = 0; fits && a < axes; a++) {
        double n = std::floor(double(x.size(x.ndim() - int(axes) + int(a))) * scales[a]);
        fits = n >= 1 && n < 9e18;
        sizes.push_back(int64_t(n));
    }
    if (!fits) {
        std::string given;
        for (double s : scale_factor.factors) given += strf("%s%g", given.empty() ? "" : ", ", s);
        detail::fail(strf("%s: x %s needs [N, C, *spatial] and scale_factor one positive number "
                          "for every spatial axis or one per axis, each leaving a size of at "
                          "least 1, got (%s)",
                          op, shape_str(x.shape()).c_str(), given.c_str()), loc);
    }
    if (recompute) scales.assign(axes, 0.0);
    return resize(op, x, sizes, scales, mode, align_corners, loc);
}
Tensor interpolate(const Tensor& x, ScaleFactor scale_factor, const std::string& mode,
                   bool align_corners, bool recompute_scale_factor, Loc loc) {
    return resize_by("interpolate", x, scale_factor, mode, align_corners,
                     recompute_scale_factor, loc);
}
// Reflect, replicate and circular read x through index_select along each padded axis, the
// source of output o (input position o - before) computed from an arange
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, const std::string& mode,
           double value, Loc loc) {
    detail::UserLocScope at(loc);
    if (pads.size() % 2 || pads.size() / 2 > size_t(x.ndim()))
        detail::fail(strf("pad: %zu sizes for x %s: (before, after) pairs, the last axis first, "
                          "for at most its %d axes", pads.size(), shape_str(x.shape()).c_str(),
                          x.ndim()));
    bool constant = mode == "constant";
    if (!constant && mode != "reflect" && mode != "replicate" && mode != "circular")
        detail::fail(strf("pad: mode \"%s\" is not one of constant, reflect, replicate, "
                          "circular", mode.c_str()));
    Tensor y = x;
    for (size_t a = 0; a < pads.size() / 2; a++) {
        int axis = x.ndim() - 1 - int(a);
        int64_t n = x.size(axis), before = pads[2 * a], after = pads[2 * a + 1];
        if (n + before + after < 0)
            detail::fail(strf("pad: %s cut axis %d of x %s below nothing",
                              shape_str(pads).c_str(), axis, shape_str(x.shape()).c_str()));
        if (constant) {   // pad what grows, then cut what shrinks
            std::vector<std::pair<int64_t, int64_t>> grow(size_t(x.ndim()), {0, 0});
            grow[size_t(axis)] = {std::max<int64_t>(before, 0), std::max<int64_t>(after, 0)};
            y = y.pad(grow, value);
            y = y.slice(axis, std::max<int64_t>(-before, 0),
                        y.size(axis) - std::max<int64_t>(-after, 0));
            continue;
        }
        // an output position reads source position `from`, mirrored, held or wrapped into
        // the axis; a cut only moves where `from` starts or ends
        int64_t most = mode == "reflect" ? n - 1 : mode == "circular" ? n : INT64_MAX;
        if (n == 0 && before + after > 0)
            detail::fail(strf("pad: %s cannot pad axis %d of x %s: it is empty", mode.c_str(),
                              axis, shape_str(x.shape()).c_str()));
        if (before > most || after > most)
            detail::fail(strf("pad: %s pads of %s along axis %d of x %s must be at most %s "
                              "(%lld)", mode.c_str(), shape_str(pads).c_str(), axis,
                              shape_str(x.shape()).c_str(),
                              mode == "reflect" ? "the axis's size - 1" : "the axis's size",
                              (long long)most));
        Tensor from = Tensor::arange(n + before + after) - before;
        Tensor source = mode == "replicate" ? from.clamp(0, n - 1)
                        : mode == "circular" ? from % n
                                              : (n - 1) - ((n - 1) - from.abs()).abs();
        y = y.index_select(axis, source);
    }
    return y;
}
Tensor normalize(const Tensor& x, double p, int axis, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    return x / x.norm(p, axis, true).clamp(eps);
}
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int axis, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    Shape both = broadcast_shape(x1.shape(), x2.shape(), "cosine_similarity", loc);
    Tensor a = x1.expand(both), b = x2.expand(both);
    return (a * b).sum(axis) / (a.norm(2, axis).clamp(eps) * b.norm(2, axis).clamp(eps));
}
Tensor one_hot(const Tensor& ids, int64_t num_classes, Loc loc) {
    detail::UserLocScope at(loc);
    if (ids.dtype() != DType::INT32 && ids.dtype() != DType::INT64)
        detail::fail(strf("one_hot: ids must be int32 or int64, got %s",
                          dtype_name(ids.dtype())));
    if (num_classes < 0) num_classes = ids.numel() ? int64_t(ids.max().item()) + 1 : 0;
    // the identity's rows, picked by an index that the program checks
    Tensor classes = Tensor::arange(num_classes);
    Tensor identity = classes.reshape({num_classes, 1}) == classes.reshape({1, num_classes});
    return rows_of(identity.cast(DType::INT64), ids, loc);
}
Tensor embedding(const Tensor& ids, const Tensor& weight, std::optional<int64_t> padding_idx,
                 Loc loc) {
    check_index(weight, ids, "embedding", loc);
    detail::UserLocScope at(loc);
    Tensor rows = rows_of(weight, ids, loc);
    std::optional<int64_t> padding = padding_row(padding_idx, weight.size(0), "embedding");
    if (!padding) return rows;   // a padding id's row: its value without its gradient
    return where((ids == *padding).unsqueeze(-1), rows.detach(), rows);
}
// Every bag seen as a row of a mask over the positions: [bags, length] over ids [bags, length],
// [bags, n] over ids [n] (position i is in bag b when b is the last offset at most i); the
// rows then [bags or 1, positions, dim], reduced along the positions
Tensor embedding_bag(const Tensor& ids, const Tensor& weight, const Tensor& offsets,
                     const std::string& mode, const Tensor& per_sample_weights,
                     bool include_last_offset, std::optional<int64_t> padding_idx, Loc loc) {
    const char* op = "embedding_bag";
    check_index(weight, ids, op, loc);
    detail::UserLocScope at(loc);
    if (mode != "mean" && mode != "sum" && mode != "max")
        detail::fail(strf("%s: mode \"%s\" is not \"mean\", \"sum\" or \"max\"", op,
                          mode.c_str()));
    if (per_sample_weights.defined() &&
        (mode != "sum" || per_sample_weights.shape() != ids.shape()))
        detail::fail(strf("%s: per_sample_weights %s need mode \"sum\" (not \"%s\") and ids' "
                          "shape %s", op, shape_str(per_sample_weights.shape()).c_str(),
                          mode.c_str(), shape_str(ids.shape()).c_str()));
    Tensor in_bag;   // bool [bags, positions]
    if (ids.ndim() == 2 && !offsets.defined()) {
        in_bag = Tensor::ones(ids.shape(), DType::BOOL);
    } else if (ids.ndim() == 1 && offsets.defined() && offsets.ndim() == 1 &&
               !dtype_is_float(offsets.dtype()) && offsets.size(0) > int64_t(include_last_offset)) {
        const int64_t bags = offsets.size(0) - int64_t(include_last_offset), n = ids.size(0);
        Tensor starts = offsets.slice(0, 0, bags).cast(DType::INT64).reshape({bags, 1});
        Tensor last_end = Tensor::full({1, 1}, n, DType::INT64);   // each bag ends at the next
        Tensor ends = bags > 1 ? cat({starts.slice(0, 1, bags), last_end}) : last_end;
        Tensor position = Tensor::arange(n).reshape({1, n});
        in_bag = logical_and(position >= starts, position < ends);
    } else {
        detail::fail(strf("%s: ids %s with offsets %s: ids [bags, length] need no offsets, ids "
                          "[n] int offsets [bags]%s", op, shape_str(ids.shape()).c_str(),
                          offsets.defined() ? shape_str(offsets.shape()).c_str() : "undefined",
                          include_last_offset ? " and the last offset" : ""));
    }
    std::optional<int64_t> padding = padding_row(padding_idx, weight.size(0), op);
    Tensor flat_ids = ids.ndim() == 2 ? ids : ids.unsqueeze(0);   // [bags or 1, positions]
    if (padding) in_bag = logical_and(in_bag, flat_ids != *padding);
    Tensor rows = rows_of(weight, flat_ids, loc);   // [bags or 1, positions, dim]
    Tensor counted = in_bag.unsqueeze(-1);
    Tensor count = in_bag.sum(1).unsqueeze(-1);   // [bags, 1]
    if (mode == "max") {
        Tensor largest = where(counted, rows, -INFINITY).max(1);
        return where(count > 0, largest, 0);
    }
    Tensor share = counted.cast(weight.dtype());
    if (per_sample_weights.defined())
        share = share * per_sample_weights.reshape(flat_ids.shape()).unsqueeze(-1);
    Tensor sums = (rows * share).sum(1);
    if (mode == "sum") return sums;
    return sums / count.maximum(1).cast(weight.dtype());
}
Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    check_dropout_p(p, "dropout");
    if (!training || p == 0) return x;
    return dropout_mask(x, p, Tensor::rand_like(x, seed));
}
static Tensor channel_dropout(const char* op, int spatial_axes, const Tensor& x, double p,
                              bool training, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    check_dropout_p(p, op);
    Shape mask = channel_mask_shape("dropout", x, spatial_axes);
    if (!training || p == 0) return x;
    return dropout_mask(x, p, Tensor::rand(mask, seed));
}
Tensor dropout1d(const Tensor& x, double p, bool training, uint64_t seed, Loc loc) {
    return channel_dropout("dropout1d", 1, x, p, training, seed, loc);
}
Tensor dropout2d(const Tensor& x, double p, bool training, uint64_t seed, Loc loc) {
    return channel_dropout("dropout2d", 2, x, p, training, seed, loc);
}
Tensor dropout3d(const Tensor& x, double p, bool training, uint64_t seed, Loc loc) {
    return channel_dropout("dropout3d", 3, x, p, training, seed, loc);
}
// x [*, C, r·H, r·W] seen as [*, C, H, r, W, r] and [*, C·r², H, W] as [*, C, r, r, H, W]:
// the two orders of the same axes
static Tensor pixel_shuffled(const char* op, const Tensor& x, int64_t r, bool up, Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(x, op, loc);
    const int n = x.ndim();
    if (n < 3 || r < 1 || (up ? x.size(-3) % (r * r) : x.size(-2) % r || x.size(-1) % r))
        detail::fail(strf("%s: x %s needs [*, C, H, W] with %s, by %lld", op,
                          shape_str(x.shape()).c_str(),
                          up ? "C a multiple of the factor squared"
                             : "H and W multiples of the factor",
                          (long long)r));
    Shape lead(x.shape().begin(), x.shape().end() - 3);
    const int64_t c = up ? x.size(-3) / (r * r) : x.size(-3);
    const int64_t h = up ? x.size(-2) : x.size(-2) / r, w = up ? x.size(-1) : x.size(-1) / r;
    auto with_lead = [&](std::initializer_list<int64_t> rest) {
        Shape s = lead;
        s.insert(s.end(), rest);
        return s;
    };
    std::vector<int> order;   // [..., C, r, r, H, W] <-> [..., C, H, r, W, r]
    for (int i = 0; i < n - 3; i++) order.push_back(i);
    const int b = n - 3;
    if (up) {
        for (int i : {0, 3, 1, 4, 2}) order.push_back(b + i);
        return x.reshape(with_lead({c, r, r, h, w})).permute(order)
            .reshape(with_lead({c, h * r, w * r}));
    }
    for (int i : {0, 2, 4, 1, 3}) order.push_back(b + i);
    return x.reshape(with_lead({c, h, r, w, r})).permute(order)
        .reshape(with_lead({c * r * r, h, w}));
}
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor, Loc loc) {
    return pixel_shuffled("pixel_shuffle", x, upscale_factor, true, loc);
}
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor, Loc loc) {
    return pixel_shuffled("pixel_unshuffle", x, downscale_factor, false, loc);
}
Tensor channel_shuffle(const Tensor& x, int64_t groups, Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(x, "channel_shuffle", loc);
    if (x.ndim() < 2 || groups < 1 || x.size(1) % groups)
        detail::fail(strf("channel_shuffle: x %s needs [N, C, *] with C a multiple of groups %lld",
                          shape_str(x.shape()).c_str(), (long long)groups));
    return x.unflatten(1, {groups, x.size(1) / groups}).transpose(1, 2).flatten(1, 2);
}

}  // namespace functional

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double e, bool affine, Loc loc)
    : num_groups(groups), num_channels(channels), eps(e) {
    detail::UserLocScope at(loc);
    if (groups <= 0 || channels <= 0 || channels % groups != 0)
        detail::fail(strf("GroupNorm: %lld channels do not split into %lld groups",
                          (long long)channels, (long long)groups));
    if (affine) {
        weight = Tensor::ones({channels}).requires_grad();
        bias = Tensor::zeros({channels}).requires_grad();
    }
}
Tensor GroupNorm::forward(const Tensor& x) {
    if (x.ndim() < 2 || x.size(1) != num_channels)
        detail::fail(strf("GroupNorm: x %s needs [N, %lld, *]", shape_str(x.shape()).c_str(),
                          (long long)num_channels));
    return functional::group_norm(x, num_groups, weight, bias, eps);
}
Module::Named GroupNorm::named_parameters() {
    if (!weight.defined()) return {};
    return {{"weight", weight}, {"bias", bias}};
}

// The buffers are realized from the start: a constant would fold into a jitted step's program.
BatchNormNd::BatchNormNd(int axes, int64_t features, double e, std::optional<double> m,
                         bool affine, bool track_running_stats, Loc loc)
    : spatial_axes(axes), num_features(features), eps(e), momentum(m) {
    detail::UserLocScope at(loc);
    if (features <= 0)
        detail::fail(strf("BatchNorm%dd: num_features must be positive, got %lld", axes,
                          (long long)features));
    if (affine) {
        weight = Tensor::ones({features}).requires_grad();
        bias = Tensor::zeros({features}).requires_grad();
    }
    if (!track_running_stats) return;
    running_mean = Tensor::from_vector(std::vector<float>(size_t(features), 0.f));
    running_var = Tensor::from_vector(std::vector<float>(size_t(features), 1.f));
    num_batches_tracked = Tensor::from_vector(std::vector<int64_t>{0}, {});
}
Tensor BatchNormNd::forward(const Tensor& x) {
    bool fits = x.ndim() == spatial_axes + 2 || (spatial_axes == 1 && x.ndim() == 2);
    if (!fits || x.size(1) != num_features) {
        long long c = num_features;
        std::string want = spatial_axes == 1 ? strf("[N, %lld] or [N, %lld, L]", c, c)
                           : spatial_axes == 2 ? strf("[N, %lld, H, W]", c)
                                               : strf("[N, %lld, D, H, W]", c);
        detail::fail(strf("BatchNorm%dd: x %s needs %s", spatial_axes,
                          shape_str(x.shape()).c_str(), want.c_str()));
    }
    bool batch_statistics = training || !running_mean.defined();
    return functional::batch_norm_counted(x, running_mean, running_var, weight, bias,
                                          batch_statistics, momentum, eps, num_batches_tracked,
                                          Loc::here());
}
Module::Named BatchNormNd::named_parameters() {
    if (!weight.defined()) return {};
    return {{"weight", weight}, {"bias", bias}};
}
Module::Named BatchNormNd::named_buffers() {
    if (!running_mean.defined()) return {};
    return {{"running_mean", running_mean},
            {"running_var", running_var},
            {"num_batches_tracked", num_batches_tracked}};
}

InstanceNormNd::InstanceNormNd(int axes, int64_t features, double e, double m, bool affine,
                               bool track_running_stats, Loc loc)
    : spatial_axes(axes), num_features(features), eps(e), momentum(m) {
    detail::UserLocScope at(loc);
    if (features <= 0)
        detail::fail(strf("InstanceNorm%dd: num_features must be positive, got %lld", axes,
                          (long long)features));
    if (affine) {
        weight = Tensor::ones({features}).requires_grad();
        bias = Tensor::zeros({features}).requires_grad();
    }
    if (!track_running_stats) return;
    running_mean = Tensor::from_vector(std::vector<float>(size_t(features), 0.f));
    running_var = Tensor::from_vector(std::vector<float>(size_t(features), 1.f));
    num_batches_tracked = Tensor::from_vector(std::vector<int64_t>{0}, {});
}
// An unbatched x [C, *spatial] is one sample. A channel count other than num_features is
// refused only where the layer holds per-channel state (PyTorch warns when it holds none).
Tensor InstanceNormNd::forward(const Tensor& x) {
    bool batched = x.ndim() == spatial_axes + 2;
    if ((!batched && x.ndim() != spatial_axes + 1) ||
        ((weight.defined() || running_mean.defined()) && x.size(batched ? 1 : 0) != num_features))
        detail::fail(strf("InstanceNorm%dd: x %s needs [N, %lld, %d spatial axes] or [%lld, ...]",
                          spatial_axes, shape_str(x.shape()).c_str(), (long long)num_features,
                          spatial_axes, (long long)num_features));
    Tensor in = batched ? x : x.unsqueeze(0);
    Tensor y = functional::instance_norm(in, running_mean, running_var, weight, bias,
                                         training || !running_mean.defined(), momentum, eps,
                                         Loc::here());
    return batched ? y : y.squeeze(0);
}
Module::Named InstanceNormNd::named_parameters() {
    if (!weight.defined()) return {};
    return {{"weight", weight}, {"bias", bias}};
}
Module::Named InstanceNormNd::named_buffers() {
    if (!running_mean.defined()) return {};
    return {{"running_mean", running_mean},
            {"running_var", running_var},
            {"num_batches_tracked", num_batches_tracked}};
}

LocalResponseNorm::LocalResponseNorm(int64_t size_, double alpha_, double beta_, double k_,
                                     Loc loc)
    : size(size_), alpha(alpha_), beta(beta_), k(k_) {
    detail::UserLocScope at(loc);
    if (size < 1)
        detail::fail(strf("LocalResponseNorm: size must be at least 1, got %lld",
                          (long long)size));
}
Tensor LocalResponseNorm::forward(const Tensor& x) {
    return functional::local_response_norm(x, size, alpha, beta, k);
}

ConvNd::ConvNd(int axes, int64_t in, int64_t out, SpatialSizes kernel, SpatialSizes stride_,
               ConvPadding padding_, SpatialSizes dilation_, int64_t groups_, bool bias_,
               bool transposed_, SpatialSizes output_padding_, std::string padding_mode_,
               Loc loc)
    : spatial_axes(axes),
      in_channels(in),
      out_channels(out),
      groups(groups_),
      padding_rule(padding_.rule),
      padding_mode(std::move(padding_mode_)),
      has_bias(bias_),
      transposed(transposed_) {
    detail::UserLocScope at(loc);
    const std::string label = strf("Conv%s%dd", transposed ? "Transpose" : "", axes);
    const char* name = label.c_str();
    if (axes < 1 || axes > 3)
        detail::fail(strf("%s: not offered (Conv1d-3d, ConvTranspose1d-3d)", name));
    if (in <= 0 || out <= 0 || groups <= 0 || in % groups || out % groups)
        detail::fail(strf("%s: channels must be positive and divide by groups, got in %lld, out "
                          "%lld, groups %lld", name, (long long)in, (long long)out,
                          (long long)groups));
    kernel_size = functional::per_axis(kernel, size_t(axes), name, "kernel_size", 1);
    stride = functional::per_axis(stride_, size_t(axes), name, "stride", 1);
    dilation = functional::per_axis(dilation_, size_t(axes), name, "dilation", 1);
    if (padding_mode != "zeros" && padding_mode != "reflect" && padding_mode != "replicate" &&
        padding_mode != "circular")
        detail::fail(strf("%s: padding_mode \"%s\" is not one of zeros, reflect, replicate, "
                          "circular", name, padding_mode.c_str()));
    if (transposed && (padding_mode != "zeros" || !padding_rule.empty()))
        detail::fail(strf("%s: takes padding sizes and padding_mode zeros only", name));
    // checked now, as PyTorch's: "same" with a stride, an unknown rule
    for (auto [before, after] : functional::conv_pads(name, padding_, kernel_size, stride,
                                                      dilation))
        padding.push_back(before);
    output_padding =
        functional::per_axis(output_padding_, size_t(axes), name, "output_padding", 0);
    reset_parameters(has_bias ? std::vector<uint64_t>{Tensor::next_seed(), Tensor::next_seed()}
                              : std::vector<uint64_t>{Tensor::next_seed()});
}
void ConvNd::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, has_bias ? 2 : 1,
                     strf("Conv%s%dd", transposed ? "Transpose" : "", spatial_axes).c_str());
    seeds = s;
    Shape shape = transposed ? Shape{in_channels, out_channels / groups}
                             : Shape{out_channels, in_channels / groups};
    shape.insert(shape.end(), kernel_size.begin(), kernel_size.end());
    int64_t fan_in = 1;
    for (size_t a = 1; a < shape.size(); a++) fan_in *= shape[a];
    double b = 1 / std::sqrt(double(fan_in));
    weight = init::uniform(shape, -b, b, s.at(0)).requires_grad();
    if (has_bias) bias = init::uniform({out_channels}, -b, b, s.at(1)).requires_grad();
}
Tensor ConvNd::forward(const Tensor& x) {
    Tensor b = has_bias ? bias : Tensor();
    SpatialSizes st, pad, dil, extra;
    st.sizes = stride, pad.sizes = padding, dil.sizes = dilation, extra.sizes = output_padding;
    if (transposed) {
        auto convolve = spatial_axes == 1   ? functional::conv_transpose1d
                        : spatial_axes == 2 ? functional::conv_transpose2d
                                            : functional::conv_transpose3d;
        return convolve(x, weight, b, st, pad, extra, groups, dil, Loc::here());
    }
    ConvPadding how = pad;
    if (!padding_rule.empty()) how = ConvPadding(padding_rule.c_str());
    Tensor input = x;
    if (padding_mode != "zeros") {   // F.pad's order: the last axis first
        std::vector<int64_t> flat;
        std::vector<std::pair<int64_t, int64_t>> pads =
            functional::conv_pads("Conv", how, kernel_size, stride, dilation);
        for (auto it = pads.rbegin(); it != pads.rend(); ++it)
            flat.push_back(it->first), flat.push_back(it->second);
        input = functional::pad(x, flat, padding_mode);
        how = 0;
    }
    return spatial_axes == 1   ? functional::conv1d(input, weight, b, st, how, dil, groups)
           : spatial_axes == 2 ? functional::conv2d(input, weight, b, st, how, dil, groups)
                               : functional::conv3d(input, weight, b, st, how, dil, groups);
}
Module::Named ConvNd::named_parameters() {
    if (!has_bias) return {{"weight", weight}};
    return {{"weight", weight}, {"bias", bias}};
}
Tensor MaxPoolNd::forward(const Tensor& x) {
    return functional::max_pool(functional::max_pool_names[spatial_axes], size_t(spatial_axes),
                                x, kernel_size, stride, padding, dilation, ceil_mode, false,
                                Loc::here());
}
Tensor MaxUnpoolNd::operator()(const Tensor& x, const Tensor& indices, SpatialSizes output_size,
                               Loc loc) {
    return functional::max_unpool(functional::max_unpool_names[spatial_axes],
                                  size_t(spatial_axes), x, indices, kernel_size, stride, padding,
                                  output_size, loc);
}
Tensor MaxUnpoolNd::forward(const Tensor& x) {
    detail::fail(strf("%s: forward(x) with x %s alone: it takes the indices too, (x, indices)",
                      functional::max_unpool_names[spatial_axes], shape_str(x.shape()).c_str()));
}
Tensor Upsample::forward(const Tensor& x) {
    if (x.ndim() < 3)
        detail::fail(strf("Upsample: x %s needs [N, C, *spatial]", shape_str(x.shape()).c_str()));
    if (size.sizes.empty())
        return functional::resize_by("Upsample", x, ScaleFactor{{scale_factor}}, mode,
                                     align_corners, false, Loc::here());
    size_t axes = size_t(x.ndim() - 2);
    std::vector<int64_t> sizes = functional::per_axis(size, axes, "Upsample", "size", 1);
    return functional::resize("Upsample", x, sizes, std::vector<double>(axes, 0.0), mode,
                              align_corners, Loc::here());
}
Tensor AdaptivePoolNd::forward(const Tensor& x) {
    std::string op = strf("adaptive_%s_pool%dd", largest ? "max" : "avg", spatial_axes);
    return functional::adaptive_pool(op.c_str(), size_t(spatial_axes), x, output_size, largest,
                                     Loc::here());
}
Tensor AvgPoolNd::forward(const Tensor& x) {
    return functional::avg_pool(functional::avg_pool_names[spatial_axes], size_t(spatial_axes),
                                x, kernel_size, stride, padding, count_include_pad, ceil_mode,
                                divisor_override, Loc::here());
}
Tensor PixelShuffle::forward(const Tensor& x) {
    return functional::pixel_shuffle(x, upscale_factor);
}
Tensor PixelUnshuffle::forward(const Tensor& x) {
    return functional::pixel_unshuffle(x, downscale_factor);
}
Tensor ChannelShuffle::forward(const Tensor& x) { return functional::channel_shuffle(x, groups); }
Tensor Unfold::forward(const Tensor& x) {
    return functional::unfold(x, kernel_size, dilation, padding, stride);
}
Tensor Fold::forward(const Tensor& x) {
    return functional::fold(x, output_size, kernel_size, dilation, padding, stride);
}
PadNd::PadNd(const char* name, int axes, SpatialSizes padding, std::string mode_, double value_,
             Loc loc)
    : mode(std::move(mode_)), value(value_) {
    detail::UserLocScope at(loc);
    const size_t sides = size_t(2 * axes);
    if (padding.sizes.size() != 1 && padding.sizes.size() != sides)
        detail::fail(strf("%s%dd: padding %s must be one size or %zu", name, axes,
                          shape_str(padding.sizes).c_str(), sides));
    pads = padding.sizes.size() == 1 ? std::vector<int64_t>(sides, padding.sizes[0])
                                     : padding.sizes;
}
Tensor PadNd::forward(const Tensor& x) { return functional::pad(x, pads, mode, value); }
Tensor LPPoolNd::forward(const Tensor& x) {
    return functional::lp_pool(spatial_axes == 1 ? "lp_pool1d" : "lp_pool2d",
                               size_t(spatial_axes), x, norm_type, kernel_size, stride,
                               ceil_mode, Loc::here());
}

ModuleList& ModuleList::add(std::shared_ptr<Module> layer, Loc loc) {
    if (!layer) detail::fail("ModuleList: add of an empty layer pointer", loc);
    layers.push_back(std::move(layer));
    return *this;
}
Tensor ModuleList::forward(const Tensor&) {
    detail::fail("ModuleList: it has no forward of its own; call its layers (at<L>(i))");
}
void ModuleList::at_failed(size_t i, Loc loc) const {
    if (i >= layers.size())
        detail::fail(strf("ModuleList: layer %zu of %zu", i, layers.size()), loc);
    detail::fail(strf("ModuleList: layer %zu is not of the type asked for", i), loc);
}
std::vector<std::pair<std::string, Module*>> ModuleList::children() {
    std::vector<std::pair<std::string, Module*>> out;
    for (size_t i = 0; i < layers.size(); i++) out.push_back({std::to_string(i), layers[i].get()});
    return out;
}

CausalSelfAttention::CausalSelfAttention(int64_t d, int64_t h, double dropout, Loc loc)
    : dim(d), heads(h), qkv(d, 3 * d, true, loc), proj(d, d, true, loc), attn_drop(dropout, loc) {
    detail::UserLocScope at(loc);
    if (h <= 0 || d % h != 0)
        detail::fail(strf("CausalSelfAttention: dim %lld is not a multiple of heads %lld",
                          (long long)d, (long long)h));
    take_seeds_of_children();
}
MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double dropout, bool bias,
                                       bool batch_first_, bool add_bias_kv_,
                                       bool add_zero_attn_, int64_t kdim_, int64_t vdim_,
                                       Loc loc)
    : embed_dim(e), num_heads(h), kdim(kdim_ ? kdim_ : e), vdim(vdim_ ? vdim_ : e),
      has_bias(bias), batch_first(batch_first_), add_bias_kv(add_bias_kv_),
      add_zero_attn(add_zero_attn_), out_proj(e, e, bias, loc), attn_drop(dropout, loc) {
    detail::UserLocScope at(loc);
    if (h <= 0 || e % h != 0)
        detail::fail(strf("MultiheadAttention: embed_dim %lld is not a multiple of num_heads "
                          "%lld", (long long)e, (long long)h));
    if (kdim < 0 || vdim < 0)
        detail::fail(strf("MultiheadAttention: kdim %lld and vdim %lld must be positive (0: "
                          "embed_dim)", (long long)kdim_, (long long)vdim_));
    std::vector<uint64_t> s;
    for (size_t i = 0; i < own_seeds(); i++) s.push_back(Tensor::next_seed());
    s.insert(s.end(), out_proj.seeds.begin(), out_proj.seeds.end());
    s.insert(s.end(), attn_drop.seeds.begin(), attn_drop.seeds.end());
    reset_parameters(s);
}
size_t MultiheadAttention::own_seeds() const {
    return (kdim == embed_dim && vdim == embed_dim ? 1 : 3) + (add_bias_kv ? 2 : 0);
}
// seeds: in_proj_weight's (or q's, k's and v's), bias_k's and bias_v's, then the children's
void MultiheadAttention::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, own_seeds() + out_proj.seeds.size() + attn_drop.seeds.size(),
                     "MultiheadAttention");
    Module::reset_parameters(std::vector<uint64_t>(s.begin() + std::ptrdiff_t(own_seeds()),
                                                   s.end()));
    seeds = s;
    const int64_t E = embed_dim;
    size_t next = 0;
    if (kdim == E && vdim == E) {
        in_proj_weight = init::xavier_uniform({3 * E, E}, E, 3 * E, s.at(next++)).requires_grad();
    } else {
        q_proj_weight = init::xavier_uniform({E, E}, E, E, s.at(next++)).requires_grad();
        k_proj_weight = init::xavier_uniform({E, kdim}, kdim, E, s.at(next++)).requires_grad();
        v_proj_weight = init::xavier_uniform({E, vdim}, vdim, E, s.at(next++)).requires_grad();
    }
    if (add_bias_kv) {
        bias_k = init::xavier_normal({1, 1, E}, E, E, s.at(next++)).requires_grad();
        bias_v = init::xavier_normal({1, 1, E}, E, E, s.at(next++)).requires_grad();
    }
    if (!has_bias) return;
    in_proj_bias = Tensor::zeros({3 * E}).requires_grad();
    out_proj.bias = Tensor::zeros({E}).requires_grad();
}
std::vector<std::pair<std::string, Module*>> MultiheadAttention::children() {
    return {{"out_proj", &out_proj}, {"attn_drop", &attn_drop}};
}
Module::Named MultiheadAttention::named_parameters() {
    Named out;
    if (in_proj_weight.defined()) out.push_back({"in_proj_weight", in_proj_weight});
    else
        out = {{"q_proj_weight", q_proj_weight}, {"k_proj_weight", k_proj_weight},
               {"v_proj_weight", v_proj_weight}};
    if (has_bias) out.push_back({"in_proj_bias", in_proj_bias});
    if (add_bias_kv) {
        out.push_back({"bias_k", bias_k});
        out.push_back({"bias_v", bias_v});
    }
    for (auto& named : Module::named_parameters()) out.push_back(named);
    return out;
}
Tensor MultiheadAttention::forward(const Tensor& x) {
    return forward(x, x, x, Tensor(), false).output;
}
MultiheadAttention::Output MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value,
                                                       const Tensor& key_padding_mask,
                                                       bool need_weights,
                                                       const Tensor& attn_mask,
                                                       bool average_attn_weights, Loc loc) {
    UserLocScope at(loc);
    const int64_t E = embed_dim, H = num_heads, D = embed_dim / num_heads;
    auto shapes = [&] {
        return strf("query %s, key %s, value %s", shape_str(query.shape()).c_str(),
                    shape_str(key.shape()).c_str(), shape_str(value.shape()).c_str());
    };
    const bool batched = query.ndim() == 3;
    auto as_batch_first = [&](const Tensor& t) {   // [N, L, E]
        return !batched ? t.unsqueeze(0) : batch_first ? t : t.transpose(0, 1);
    };
    bool fits = (query.ndim() == 2 || batched) && key.ndim() == query.ndim() &&
                value.ndim() == query.ndim();
    Tensor q, k, v;
    if (fits) {
        q = as_batch_first(query);
        k = as_batch_first(key);
        v = as_batch_first(value);
        fits = q.size(-1) == E && k.size(-1) == kdim && v.size(-1) == vdim &&
               k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == v.size(1);
    }
    if (!fits)
        detail::fail(strf("MultiheadAttention: %s must be [L, N, %lld], [S, N, %lld] and [S, N, "
                          "%lld]%s (or without N)", shapes().c_str(), (long long)E,
                          (long long)kdim, (long long)vdim, batch_first ? " with N first" : ""));
    const int64_t N = q.size(0), L = q.size(1), S = k.size(1);
    auto project = [&](const Tensor& t, int part) {   // [N, T, features] → [N, T, E]
        const Tensor* own[3] = {&q_proj_weight, &k_proj_weight, &v_proj_weight};
        Tensor w = in_proj_weight.defined() ? in_proj_weight.slice(0, part * E, (part + 1) * E)
                                            : *own[part];
        Tensor b = has_bias ? in_proj_bias.slice(0, part * E, (part + 1) * E) : Tensor();
        return functional::linear(t, w, b);
    };
    auto heads = [&](const Tensor& t) {   // [N, T, E] → [N, H, T, D]
        return t.reshape({N, t.size(1), H, D}).transpose(1, 2);
    };
    Tensor keys = project(k, 1), values = project(v, 2);
    int64_t more = 0;   // keys after the S given: bias_k's, then zeros
    if (add_bias_kv) {
        keys = cat({keys, bias_k.expand({N, 1, E})}, 1);
        values = cat({values, bias_v.expand({N, 1, E})}, 1);
        more++;
    }
    keys = heads(keys);
    values = heads(values);
    if (add_zero_attn) {
        keys = cat({keys, Tensor::zeros({N, H, 1, D}, keys.dtype())}, 2);
        values = cat({values, Tensor::zeros({N, H, 1, D}, values.dtype())}, 2);
        more++;
    }
    // the masks as one added to the scores (a bool's true: -∞), for attention_weights
    Tensor added;
    auto add_mask = [&](const Tensor& mask, const Shape& as, const char* name) {
        if (!mask.defined()) return;
        if (mask.dtype() != DType::BOOL && mask.dtype() != q.dtype())
            detail::fail(strf("MultiheadAttention: %s must be bool or %s, got %s", name,
                              dtype_name(q.dtype()), dtype_name(mask.dtype())));
        Tensor m = mask.dtype() != DType::BOOL
                       ? mask.reshape(as)
                       : where(mask.reshape(as), -INFINITY, Tensor::zeros(as, q.dtype()));
        added = added.defined() ? added + m : m;
    };
    Shape padding = {N, 1, 1, S}, per_query = {L, S}, per_head = {N * H, L, S};
    if (key_padding_mask.defined() && key_padding_mask.shape() != Shape{N, S} &&
        !(!batched && key_padding_mask.shape() == Shape{S}))
        detail::fail(strf("MultiheadAttention: key_padding_mask %s must be [N, S] = [%lld, "
                          "%lld]; %s", shape_str(key_padding_mask.shape()).c_str(),
                          (long long)N, (long long)S, shapes().c_str()));
    if (attn_mask.defined() && attn_mask.shape() != per_query && attn_mask.shape() != per_head)
        detail::fail(strf("MultiheadAttention: attn_mask %s must be [L, S] = %s or [N·heads, "
                          "L, S] = %s; %s", shape_str(attn_mask.shape()).c_str(),
                          shape_str(per_query).c_str(), shape_str(per_head).c_str(),
                          shapes().c_str()));
    add_mask(key_padding_mask, padding, "key_padding_mask");
    add_mask(attn_mask, attn_mask.defined() && attn_mask.ndim() == 3 ? Shape{N, H, L, S}
                                                                    : Shape{1, 1, L, S},
             "attn_mask");
    if (added.defined() && more) {   // the extra keys allowed
        std::vector<std::pair<int64_t, int64_t>> after(size_t(added.ndim()), {0, 0});
        after.back() = {0, more};
        added = added.pad(after);
    }
    Tensor weights = attn_drop(
        detail::attention_weights(heads(project(q, 0)), keys, false, Loc::here(), added));
    Tensor out = out_proj(weights.matmul(values).transpose(1, 2).reshape({N, L, E}));
    out = !batched ? out.squeeze(0) : batch_first ? out : out.transpose(0, 1);
    if (!need_weights) return {out, Tensor()};
    Tensor w = average_attn_weights ? weights.mean(1) : weights;
    return {out, batched ? w : w.squeeze(0)};
}
namespace {
// The gates of a recurrent cell of mode (RNNBase's), and the layer's or cell's name
int64_t recurrent_gates(const std::string& mode, const char* who) {
    if (mode == "RNN_TANH" || mode == "RNN_RELU") return 1;
    if (mode == "LSTM") return 4;
    if (mode == "GRU") return 3;
    detail::fail(strf("%s: mode \"%s\" is not one of RNN_TANH, RNN_RELU, LSTM, GRU", who,
                      mode.c_str()));
}
std::string recurrent_name(const std::string& mode, bool cell) {
    return (mode.rfind("RNN", 0) == 0 ? std::string("RNN") : mode) + (cell ? "Cell" : "");
}
std::string rnn_mode(const std::string& nonlinearity, const char* who, Loc loc) {
    if (nonlinearity != "tanh" && nonlinearity != "relu")
        detail::fail(strf("%s: nonlinearity \"%s\" is not tanh or relu", who,
                          nonlinearity.c_str()), loc);
    return nonlinearity == "tanh" ? "RNN_TANH" : "RNN_RELU";
}
void check_recurrent_sizes(const std::string& who, int64_t input_size, int64_t hidden_size) {
    if (input_size <= 0 || hidden_size <= 0)
        detail::fail(strf("%s: input_size %lld and hidden_size %lld must be positive",
                          who.c_str(), (long long)input_size, (long long)hidden_size));
}
// weight_ih, weight_hh (and bias_ih, bias_hh; and weight_hr where the state h is a projection,
// of `state` < hidden features) of one cell of `rows` gate rows, from its seeds
std::vector<Tensor> recurrent_parameters(int64_t rows, int64_t in, int64_t hidden, bool bias,
                                         const uint64_t* seeds, int64_t state = 0) {
    const double b = 1 / std::sqrt(double(hidden));
    std::vector<Shape> shapes = {{rows, in}, {rows, state ? state : hidden}};
    if (bias) shapes.insert(shapes.end(), {{rows}, {rows}});
    if (state) shapes.push_back({state, hidden});
    std::vector<Tensor> p;
    for (const Shape& shape : shapes)
        p.push_back(init::uniform(shape, -b, b, seeds[p.size()]).requires_grad());
    return p;
}
// h_0 or c_0 as `want` (whose axis batch_axis is the batch's), given without that axis where
// the input has no batch, zeros where undefined
Tensor initial_state(const std::string& who, const char* name, const Tensor& given,
                     const Shape& want, bool batched, int batch_axis, DType dtype) {
    if (!given.defined()) return Tensor::zeros(want, dtype);
    Shape expected = want;
    if (!batched) expected.erase(expected.begin() + batch_axis);
    if (given.shape() != expected)
        detail::fail(strf("%s: %s %s must be %s", who.c_str(), name,
                          shape_str(given.shape()).c_str(), shape_str(expected).c_str()));
    return batched ? given : given.unsqueeze(batch_axis);
}
struct RecurrentState {
    Tensor h, c;   // c: LSTM's
};
// One step of a cell whose input's part, x_t·W_ihᵀ + b_ih, is given (a layer computes it for
// all its steps in one product). The gates are formed as PyTorch's cells form them; an LSTM's
// h' is projected by w_hr where given.
RecurrentState recurrent_step(const std::string& mode, const Tensor& x_part,
                              const RecurrentState& s, const Tensor& w_hh, const Tensor& b_hh,
                              const Tensor& w_hr = Tensor()) {
    Tensor h_part = functional::linear(s.h, w_hh, b_hh);
    const int64_t H = s.h.size(-1);
    if (mode == "LSTM") {
        std::vector<Tensor> g = (x_part + h_part).split(x_part.size(-1) / 4, -1);
        Tensor c = g[1].sigmoid() * s.c + g[0].sigmoid() * g[2].tanh();
        Tensor h = g[3].sigmoid() * c.tanh();
        return {w_hr.defined() ? functional::linear(h, w_hr) : h, c};
    }
    if (mode == "GRU") {
        std::vector<Tensor> xg = x_part.split(H, -1), hg = h_part.split(H, -1);
        Tensor r = (xg[0] + hg[0]).sigmoid(), z = (xg[1] + hg[1]).sigmoid();
        Tensor n = (xg[2] + r * hg[2]).tanh();
        return {n + z * (s.h - n), Tensor()};
    }
    Tensor sum = x_part + h_part;
    return {mode == "RNN_TANH" ? sum.tanh() : sum.relu(), Tensor()};
}
}  // namespace

RNNBase::RNNBase(std::string mode_, int64_t input_size_, int64_t hidden_size_, int64_t layers,
                 bool bias, bool batch_first_, double dropout, bool bidirectional_,
                 int64_t proj_size_, Loc loc)
    : mode(std::move(mode_)), input_size(input_size_), hidden_size(hidden_size_),
      num_layers(layers), proj_size(proj_size_), has_bias(bias), batch_first(batch_first_),
      bidirectional(bidirectional_), drop(dropout, loc) {
    detail::UserLocScope at(loc);
    const std::string who = recurrent_name(mode, false);
    recurrent_gates(mode, who.c_str());
    check_recurrent_sizes(who, input_size, hidden_size);
    if (num_layers < 1)
        detail::fail(strf("%s: num_layers must be at least 1, got %lld", who.c_str(),
                          (long long)num_layers));
    if (proj_size && (mode != "LSTM" || proj_size < 0 || proj_size >= hidden_size))
        detail::fail(strf("%s: proj_size %lld must be 0 or, for an LSTM, less than hidden_size "
                          "%lld", who.c_str(), (long long)proj_size, (long long)hidden_size));
    std::vector<uint64_t> s;
    for (int64_t i = 0; i < num_layers * (bidirectional ? 2 : 1) * cell_parameters(); i++)
        s.push_back(Tensor::next_seed());
    s.insert(s.end(), drop.seeds.begin(), drop.seeds.end());
    reset_parameters(s);
}
int64_t RNNBase::cell_parameters() const { return (has_bias ? 4 : 2) + (proj_size ? 1 : 0); }
// seeds: each layer's and direction's parameters', in the order of named_parameters, then the
// dropout's
void RNNBase::reset_parameters(const std::vector<uint64_t>& s) {
    const int64_t D = bidirectional ? 2 : 1, per_cell = cell_parameters();
    const int64_t state = proj_size ? proj_size : hidden_size;
    const size_t own = size_t(num_layers * D * per_cell);
    check_seed_count(s, own + drop.seeds.size(), recurrent_name(mode, false).c_str());
    Module::reset_parameters(std::vector<uint64_t>(s.begin() + long(own), s.end()));
    seeds = s;
    weight_ih.clear(), weight_hh.clear(), bias_ih.clear(), bias_hh.clear(), weight_hr.clear();
    for (int64_t i = 0; i < num_layers * D; i++) {
        const int64_t in = i < D ? input_size : D * state;
        std::vector<Tensor> p = recurrent_parameters(
            recurrent_gates(mode, "RNNBase") * hidden_size, in, hidden_size, has_bias,
            &s.at(size_t(i * per_cell)), proj_size);
        weight_ih.push_back(p[0]);
        weight_hh.push_back(p[1]);
        if (has_bias) bias_ih.push_back(p[2]), bias_hh.push_back(p[3]);
        if (proj_size) weight_hr.push_back(p.back());
    }
}
Module::Named RNNBase::named_parameters() {
    Named out;
    const int64_t D = bidirectional ? 2 : 1;
    for (int64_t i = 0; i < num_layers * D; i++) {
        const std::string suffix =
            "_l" + std::to_string(i / D) + (i % D ? std::string("_reverse") : "");
        out.push_back({"weight_ih" + suffix, weight_ih[size_t(i)]});
        out.push_back({"weight_hh" + suffix, weight_hh[size_t(i)]});
        if (has_bias) {
            out.push_back({"bias_ih" + suffix, bias_ih[size_t(i)]});
            out.push_back({"bias_hh" + suffix, bias_hh[size_t(i)]});
        }
        if (proj_size) out.push_back({"weight_hr" + suffix, weight_hr[size_t(i)]});
    }
    return out;
}
std::vector<std::pair<std::string, Module*>> RNNBase::children() { return {{"drop", &drop}}; }
Tensor RNNBase::forward(const Tensor& input) { return forward(input, Tensor()).output; }
// The rows of x [T, N, *] that a sequence packed as `like` holds, packed as it is
static PackedSequence pack_steps(const Tensor& x, const PackedSequence& like) {
    std::vector<int64_t> rows;
    for (size_t t = 0; t < like.batch_sizes.size(); t++)
        for (int64_t k = 0; k < like.batch_sizes[t]; k++)
            rows.push_back(int64_t(t) * x.size(1) + like.sorted_indices[size_t(k)]);
    PackedSequence out = like;
    out.data = x.flatten(0, 1).index_select(0, Tensor::from_vector(rows));
    return out;
}
// [T, N, 1, ...] of `axes` axes: step t of sequence n is one of its lengths[n]
static Tensor within_lengths(int64_t T, const std::vector<int64_t>& lengths, size_t axes) {
    Shape along_steps(axes, 1), along_batch(axes, 1);
    along_steps[0] = T, along_batch[1] = int64_t(lengths.size());
    return Tensor::arange(T).reshape(along_steps) <
           Tensor::from_vector(lengths).reshape(along_batch);
}
static std::string list_str(const std::vector<int64_t>& v) {
    std::string out;
    for (int64_t x : v) out += strf("%s%lld", out.empty() ? "" : ", ", (long long)x);
    return "(" + out + ")";
}
PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first, bool enforce_sorted, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "pack_padded_sequence";
    if (input.ndim() < 2 || lengths.empty() ||
        int64_t(lengths.size()) != input.size(batch_first ? 0 : 1))
        detail::fail(strf("%s: input %s needs [%s, *] and a length for each sequence (at "
                          "least one), got %zu lengths", op, shape_str(input.shape()).c_str(),
                          batch_first ? "N, T" : "T, N", lengths.size()));
    Tensor x = batch_first ? input.transpose(0, 1) : input;
    for (size_t n = 0; n < lengths.size(); n++)
        if (lengths[n] < 1 || lengths[n] > x.size(0))
            detail::fail(strf("%s: length %lld of sequence %zu is not in [1, %lld] (input %s)",
                              op, (long long)lengths[n], n, (long long)x.size(0),
                              shape_str(input.shape()).c_str()));
    if (enforce_sorted && !std::is_sorted(lengths.rbegin(), lengths.rend()))
        detail::fail(strf("%s: lengths %s must not increase (the longest first), or pass "
                          "enforce_sorted = false", op, list_str(lengths).c_str()));
    PackedSequence p;
    p.sorted_indices.resize(lengths.size());
    std::iota(p.sorted_indices.begin(), p.sorted_indices.end(), int64_t(0));
    std::stable_sort(p.sorted_indices.begin(), p.sorted_indices.end(),
                     [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; });
    p.unsorted_indices.resize(lengths.size());
    for (size_t k = 0; k < lengths.size(); k++)
        p.unsorted_indices[size_t(p.sorted_indices[k])] = int64_t(k);
    for (int64_t t = 0; t < lengths[size_t(p.sorted_indices[0])]; t++)
        p.batch_sizes.push_back(std::count_if(lengths.begin(), lengths.end(),
                                              [&](int64_t len) { return len > t; }));
    return pack_steps(x, p);
}
PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first,
                                   double padding_value, int64_t total_length, Loc loc) {
    detail::UserLocScope at(loc);
    const std::vector<int64_t>& sizes = sequence.batch_sizes;
    const Tensor& data = sequence.data;
    const int64_t N = sizes.empty() ? 0 : sizes[0];
    int64_t steps = 0;
    bool fits = N > 0 && data.defined() && data.ndim() >= 1 &&
                int64_t(sequence.sorted_indices.size()) == N &&
                int64_t(sequence.unsorted_indices.size()) == N;
    for (size_t t = 0; fits && t < sizes.size(); t++) {
        fits = sizes[t] >= 1 && (t == 0 || sizes[t] <= sizes[t - 1]);
        steps += sizes[t];
    }
    for (int64_t k = 0; fits && k < N; k++) {
        int64_t n = sequence.sorted_indices[size_t(k)];
        fits = n >= 0 && n < N && sequence.unsorted_indices[size_t(n)] == k;
    }
    if (!fits || data.size(0) != steps)
        detail::fail(strf("pad_packed_sequence: batch_sizes %s must be at least 1 and not "
                          "increase, sorted_indices %s a permutation of the batch, "
                          "unsorted_indices %s its inverse, and data %s a row for each step",
                          list_str(sizes).c_str(), list_str(sequence.sorted_indices).c_str(),
                          list_str(sequence.unsorted_indices).c_str(),
                          data.defined() ? shape_str(data.shape()).c_str() : "undefined"));
    int64_t T = int64_t(sizes.size());
    if (total_length >= 0 && total_length < T)
        detail::fail(strf("pad_packed_sequence: total_length %lld is less than the longest "
                          "sequence's %lld steps", (long long)total_length, (long long)T));
    if (total_length >= 0) T = total_length;
    PaddedSequence out;
    out.lengths.resize(size_t(N));
    for (int64_t k = 0; k < N; k++)
        out.lengths[size_t(sequence.sorted_indices[size_t(k)])] =
            std::count_if(sizes.begin(), sizes.end(), [&](int64_t size) { return size > k; });
    std::vector<int64_t> rows, first_of_step(1, 0);   // padding reads row 0, then is replaced
    for (int64_t size : sizes) first_of_step.push_back(first_of_step.back() + size);
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++)
            rows.push_back(t < out.lengths[size_t(n)]
                               ? first_of_step[size_t(t)] + sequence.unsorted_indices[size_t(n)]
                               : 0);
    Shape padded = data.shape();
    padded[0] = N;
    padded.insert(padded.begin(), T);
    Tensor y = where(within_lengths(T, out.lengths, padded.size()),
                     data.index_select(0, Tensor::from_vector(rows)).reshape(padded),
                     padding_value);
    out.output = batch_first ? y.transpose(0, 1) : y;
    return out;
}
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first,
                    double padding_value, Loc loc) {
    detail::UserLocScope at(loc);
    bool fits = !sequences.empty();
    int64_t T = 0;
    for (const Tensor& s : sequences) {
        fits = fits && s.ndim() >= 1 && s.ndim() == sequences[0].ndim() &&
               std::equal(s.shape().begin() + 1, s.shape().end(), sequences[0].shape().begin() + 1);
        if (fits) T = std::max(T, s.size(0));
    }
    if (!fits) {
        std::string shapes;
        for (const Tensor& s : sequences)
            shapes += (shapes.empty() ? "" : ", ") + shape_str(s.shape());
        detail::fail(strf("pad_sequence: the sequences must be [L, *] with the same * (at least "
                          "one), got %s", shapes.empty() ? "none" : shapes.c_str()));
    }
    std::vector<Tensor> padded;
    for (const Tensor& s : sequences) {
        std::vector<int64_t> pads(size_t(2 * s.ndim()), 0);
        pads.back() = T - s.size(0);   // after axis 0, the last (before, after) pair
        padded.push_back(functional::pad(s, pads, "constant", padding_value));
    }
    return stack(padded, batch_first ? 0 : 1);
}
PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted, Loc loc) {
    std::vector<int64_t> lengths;
    for (const Tensor& s : sequences) lengths.push_back(s.ndim() >= 1 ? s.size(0) : 0);
    return pack_padded_sequence(pad_sequence(sequences, false, 0, loc), lengths, false,
                                enforce_sorted, loc);
}

// The layers over x [L, N, input_size] from h_0 and c_0 (as given: batched says whether with
// the batch axis). With lengths, sequence n runs only its first lengths[n] steps: its state
// holds after them (backward: until its last one) and its outputs past them are 0.
static RNNBase::Output run_layers(RNNBase& m, Tensor x, const Tensor& h_0, const Tensor& c_0,
                                  bool batched, const std::vector<int64_t>& lengths) {
    const std::string who = recurrent_name(m.mode, false);
    const bool lstm = m.mode == "LSTM", masked = !lengths.empty();
    if (c_0.defined() && !lstm)
        detail::fail(strf("%s: c_0 is given, but only an LSTM has a cell state", who.c_str()));
    const int64_t L = x.size(0), N = x.size(1), D = m.bidirectional ? 2 : 1;
    const Shape cells = {D * m.num_layers, N, m.hidden_size};
    const Shape states = {D * m.num_layers, N, m.proj_size ? m.proj_size : m.hidden_size};
    Tensor h0 = initial_state(who, "h_0", h_0, states, batched, 1, x.dtype());
    Tensor c0 = lstm ? initial_state(who, "c_0", c_0, cells, batched, 1, x.dtype()) : Tensor();
    Tensor running = masked ? within_lengths(L, lengths, 3) : Tensor();   // [L, N, 1]
    std::vector<Tensor> h_n, c_n;
    for (int64_t layer = 0; layer < m.num_layers; layer++) {
        if (layer > 0) x = m.drop(x);
        std::vector<Tensor> directions;
        for (int64_t d = 0; d < D; d++) {
            const size_t i = size_t(layer * D + d);
            Tensor b_ih = m.has_bias ? m.bias_ih[i] : Tensor();
            Tensor b_hh = m.has_bias ? m.bias_hh[i] : Tensor();
            Tensor x_parts = functional::linear(x, m.weight_ih[i], b_ih);
            RecurrentState s{h0[i], lstm ? c0[i] : Tensor()};
            std::vector<Tensor> outputs(static_cast<size_t>(L));
            for (int64_t k = 0; k < L; k++) {
                const int64_t t = d ? L - 1 - k : k;
                RecurrentState next = recurrent_step(m.mode, x_parts[t], s, m.weight_hh[i], b_hh,
                                                     m.proj_size ? m.weight_hr[i] : Tensor());
                if (masked) {
                    Tensor own = running[t];
                    next.h = where(own, next.h, s.h);
                    if (lstm) next.c = where(own, next.c, s.c);
                    outputs[size_t(t)] = where(own, next.h, 0.0);
                } else {
                    outputs[size_t(t)] = next.h;
                }
                s = next;
            }
            directions.push_back(stack(outputs));
            h_n.push_back(s.h);
            c_n.push_back(s.c);
        }
        x = D == 2 ? cat(directions, -1) : directions[0];
    }
    auto state = [&](const std::vector<Tensor>& last) {
        Tensor t = stack(last);
        return batched ? t : t.squeeze(1);
    };
    RNNBase::Output out;
    out.output = x;
    out.h_n = state(h_n);
    if (lstm) out.c_n = state(c_n);
    return out;
}
RNNBase::Output RNNBase::forward(const Tensor& input, const Tensor& h_0, const Tensor& c_0,
                                 Loc loc) {
    UserLocScope at(loc);
    const bool batched = input.ndim() == 3;
    if (!(batched || input.ndim() == 2) || input.size(-1) != input_size)
        detail::fail(strf("%s: input %s must be [L, N, %lld]%s or [L, %lld]",
                          recurrent_name(mode, false).c_str(), shape_str(input.shape()).c_str(),
                          (long long)input_size, batch_first ? " with N first" : "",
                          (long long)input_size));
    Tensor x = !batched ? input.unsqueeze(1) : batch_first ? input.transpose(0, 1) : input;
    Output out = run_layers(*this, x, h_0, c_0, batched, {});
    out.output = !batched   ? out.output.squeeze(1)
                 : batch_first ? out.output.transpose(0, 1)
                               : out.output;
    return out;
}
RNNBase::PackedOutput RNNBase::forward(const PackedSequence& input, const Tensor& h_0,
                                       const Tensor& c_0, Loc loc) {
    UserLocScope at(loc);
    PaddedSequence padded = pad_packed_sequence(input);
    const Tensor& x = padded.output;
    if (x.ndim() != 3 || x.size(-1) != input_size)
        detail::fail(strf("%s: a packed input's data %s must be [steps, %lld]",
                          recurrent_name(mode, false).c_str(),
                          shape_str(input.data.shape()).c_str(), (long long)input_size));
    Output run = run_layers(*this, x, h_0, c_0, true, padded.lengths);
    PackedOutput out;
    out.output = pack_steps(run.output, input);
    out.h_n = run.h_n;
    out.c_n = run.c_n;
    return out;
}
RNN::RNN(int64_t input_size, int64_t hidden_size, int64_t num_layers,
         const std::string& nonlinearity, bool bias, bool batch_first, double dropout,
         bool bidirectional, Loc loc)
    : RNNBase(rnn_mode(nonlinearity, "RNN", loc), input_size, hidden_size, num_layers, bias,
              batch_first, dropout, bidirectional, 0, loc) {}

RNNCellBase::RNNCellBase(std::string mode_, int64_t input_size_, int64_t hidden_size_,
                         bool bias, Loc loc)
    : mode(std::move(mode_)), input_size(input_size_), hidden_size(hidden_size_),
      has_bias(bias) {
    detail::UserLocScope at(loc);
    const std::string who = recurrent_name(mode, true);
    recurrent_gates(mode, who.c_str());
    check_recurrent_sizes(who, input_size, hidden_size);
    std::vector<uint64_t> s;
    for (int i = 0; i < (has_bias ? 4 : 2); i++) s.push_back(Tensor::next_seed());
    reset_parameters(s);
}
void RNNCellBase::reset_parameters(const std::vector<uint64_t>& s) {
    check_seed_count(s, has_bias ? 4 : 2, recurrent_name(mode, true).c_str());
    seeds = s;
    std::vector<Tensor> p =
        recurrent_parameters(recurrent_gates(mode, "RNNCellBase") * hidden_size, input_size,
                             hidden_size, has_bias, s.data());
    weight_ih = p[0], weight_hh = p[1];
    if (has_bias) bias_ih = p[2], bias_hh = p[3];
}
Module::Named RNNCellBase::named_parameters() {
    Named out{{"weight_ih", weight_ih}, {"weight_hh", weight_hh}};
    if (has_bias) out.push_back({"bias_ih", bias_ih}), out.push_back({"bias_hh", bias_hh});
    return out;
}
Tensor RNNCellBase::forward(const Tensor& input) { return forward(input, Tensor()).h; }
RNNCellBase::Output RNNCellBase::forward(const Tensor& input, const Tensor& hx,
                                         const Tensor& cx, Loc loc) {
    UserLocScope at(loc);
    const std::string who = recurrent_name(mode, true);
    const bool batched = input.ndim() == 2, lstm = mode == "LSTM";
    if (!(batched || input.ndim() == 1) || input.size(-1) != input_size)
        detail::fail(strf("%s: input %s must be [N, %lld] or [%lld]", who.c_str(),
                          shape_str(input.shape()).c_str(), (long long)input_size,
                          (long long)input_size));
    if (cx.defined() && !lstm)
        detail::fail(strf("%s: cx is given, but only an LSTMCell has a cell state",
                          who.c_str()));
    Tensor x = batched ? input : input.unsqueeze(0);
    const Shape state = {x.size(0), hidden_size};
    RecurrentState s{initial_state(who, "hx", hx, state, batched, 0, x.dtype()),
                     lstm ? initial_state(who, "cx", cx, state, batched, 0, x.dtype())
                          : Tensor()};
    s = recurrent_step(mode, functional::linear(x, weight_ih, has_bias ? bias_ih : Tensor()), s,
                       weight_hh, has_bias ? bias_hh : Tensor());
    if (batched) return {s.h, s.c};
    return {s.h.squeeze(0), lstm ? s.c.squeeze(0) : Tensor()};
}
RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, bool bias,
                 const std::string& nonlinearity, Loc loc)
    : RNNCellBase(rnn_mode(nonlinearity, "RNNCell", loc), input_size, hidden_size, bias, loc) {}

TransformerBlock::TransformerBlock(int64_t d, int64_t heads, double dropout, Loc loc)
    : ln1(d, 1e-5, true, true, loc), attn(d, heads, dropout, loc),
      ln2(d, 1e-5, true, true, loc),
      mlp(Linear(d, 4 * d, true, loc), GELU(true), Linear(4 * d, d, true, loc)),
      drop(dropout, loc) {
    take_seeds_of_children();
}
std::vector<std::pair<std::string, Module*>> TransformerBlock::children() {
    return {{"ln1", &ln1}, {"attn", &attn}, {"ln2", &ln2}, {"mlp", &mlp}, {"drop", &drop}};
}
Tensor TransformerBlock::forward(const Tensor& x) {
    Tensor r = x + drop(attn(ln1(x)));
    return r + drop(mlp(ln2(r)));
}
static void check_transformer_activation(const std::string& activation, const char* layer) {
    if (activation != "relu" && activation != "gelu")
        detail::fail(strf("%s: activation \"%s\" is not \"relu\" or \"gelu\"", layer,
                          activation.c_str()));
}
static Tensor transformer_activation(const std::string& activation, const Tensor& x) {
    return activation == "relu" ? x.relu() : x.gelu();
}
// true above the diagonal: position i attends to j <= i alone (MultiheadAttention's bool mask)
static Tensor causal_mask(int64_t length) {
    Tensor i = Tensor::arange(length);
    return i.reshape({1, length}) > i.reshape({length, 1});
}
// the sequence's length of x [S, N, E] ([N, S, E] with batch_first, [S, E] unbatched)
static int64_t sequence_length(const Tensor& x, bool batch_first) {
    return x.ndim() == 3 && batch_first ? x.size(1) : x.size(0);
}
TransformerEncoderLayer::TransformerEncoderLayer(int64_t d, int64_t heads, int64_t ff,
                                                 double p, const std::string& activation_,
                                                 double eps, bool batch_first, bool norm_first_,
                                                 bool bias, Loc loc)
    : self_attn(d, heads, p, bias, batch_first, false, false, 0, 0, loc),
      linear1(d, ff, bias, loc), dropout(p, loc), linear2(ff, d, bias, loc),
      norm1(d, eps, true, bias, loc), norm2(d, eps, true, bias, loc), dropout1(p, loc),
      dropout2(p, loc), activation(activation_), norm_first(norm_first_) {
    detail::UserLocScope at(loc);
    check_transformer_activation(activation, "TransformerEncoderLayer");
    take_seeds_of_children();
}
std::vector<std::pair<std::string, Module*>> TransformerEncoderLayer::children() {
    return {{"self_attn", &self_attn}, {"linear1", &linear1}, {"dropout", &dropout},
            {"linear2", &linear2},     {"norm1", &norm1},     {"norm2", &norm2},
            {"dropout1", &dropout1},   {"dropout2", &dropout2}};
}
Tensor TransformerEncoderLayer::forward(const Tensor& src) { return forward(src, Tensor()); }
Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
    Tensor mask = src_mask.defined() || !is_causal
                      ? src_mask
                      : causal_mask(sequence_length(src, self_attn.batch_first));
    auto attended = [&](const Tensor& x) {
        return dropout1(self_attn.forward(x, x, x, src_key_padding_mask, false, mask).output);
    };
    auto fed_forward = [&](const Tensor& x) {
        return dropout2(linear2(dropout(transformer_activation(activation, linear1(x)))));
    };
    if (norm_first) {
        Tensor x = src + attended(norm1(src));
        return x + fed_forward(norm2(x));
    }
    Tensor x = norm1(src + attended(src));
    return norm2(x + fed_forward(x));
}
TransformerDecoderLayer::TransformerDecoderLayer(int64_t d, int64_t heads, int64_t ff,
                                                 double p, const std::string& activation_,
                                                 double eps, bool batch_first, bool norm_first_,
                                                 bool bias, Loc loc)
    : self_attn(d, heads, p, bias, batch_first, false, false, 0, 0, loc),
      multihead_attn(d, heads, p, bias, batch_first, false, false, 0, 0, loc),
      linear1(d, ff, bias, loc), dropout(p, loc), linear2(ff, d, bias, loc),
      norm1(d, eps, true, bias, loc), norm2(d, eps, true, bias, loc),
      norm3(d, eps, true, bias, loc), dropout1(p, loc), dropout2(p, loc), dropout3(p, loc),
      activation(activation_), norm_first(norm_first_) {
    detail::UserLocScope at(loc);
    check_transformer_activation(activation, "TransformerDecoderLayer");
    take_seeds_of_children();
}
std::vector<std::pair<std::string, Module*>> TransformerDecoderLayer::children() {
    return {{"self_attn", &self_attn}, {"multihead_attn", &multihead_attn},
            {"linear1", &linear1},     {"dropout", &dropout},
            {"linear2", &linear2},     {"norm1", &norm1},
            {"norm2", &norm2},         {"norm3", &norm3},
            {"dropout1", &dropout1},   {"dropout2", &dropout2},
            {"dropout3", &dropout3}};
}
Tensor TransformerDecoderLayer::forward(const Tensor& x) {
    detail::fail(strf("TransformerDecoderLayer: forward(tgt) alone, tgt %s: it needs the "
                      "memory, forward(tgt, memory, ...)", shape_str(x.shape()).c_str()));
}
Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const Tensor& tgt_mask, const Tensor& memory_mask,
                                        const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask,
                                        bool tgt_is_causal) {
    Tensor mask = tgt_mask.defined() || !tgt_is_causal
                      ? tgt_mask
                      : causal_mask(sequence_length(tgt, self_attn.batch_first));
    auto attended = [&](const Tensor& x) {
        return dropout1(self_attn.forward(x, x, x, tgt_key_padding_mask, false, mask).output);
    };
    auto remembered = [&](const Tensor& x) {
        return dropout2(multihead_attn
                            .forward(x, memory, memory, memory_key_padding_mask, false,
                                     memory_mask)
                            .output);
    };
    auto fed_forward = [&](const Tensor& x) {
        return dropout3(linear2(dropout(transformer_activation(activation, linear1(x)))));
    };
    if (norm_first) {
        Tensor x = tgt + attended(norm1(tgt));
        x = x + remembered(norm2(x));
        return x + fed_forward(norm3(x));
    }
    Tensor x = norm1(tgt + attended(tgt));
    x = norm2(x + remembered(x));
    return norm3(x + fed_forward(x));
}
// A fresh layer of the same settings, given the layer's values (and its training mode)
template <typename Layer> static Layer copy_of(Layer& layer, Loc loc) {
    const MultiheadAttention& a = layer.self_attn;
    Layer copy(a.embed_dim, a.num_heads, layer.linear1.out_features, layer.dropout.p,
               layer.activation, layer.norm1.eps, a.batch_first, layer.norm_first,
               a.has_bias, loc);
    copy.load_state_dict(layer.state_dict(), true, loc);
    copy.train(layer.training);
    return copy;
}
static void check_layer_count(int64_t num_layers, const char* name) {
    if (num_layers < 1)
        detail::fail(strf("%s: num_layers must be at least 1, got %lld", name,
                          (long long)num_layers));
}
TransformerEncoder::TransformerEncoder(TransformerEncoderLayer layer, int64_t num_layers,
                                       std::optional<LayerNorm> norm_, Loc loc)
    : norm(std::move(norm_)) {
    detail::UserLocScope at(loc);
    check_layer_count(num_layers, "TransformerEncoder");
    for (int64_t i = 0; i < num_layers; i++) layers.append(copy_of(layer, loc));
    take_seeds_of_children();
}
std::vector<std::pair<std::string, Module*>> TransformerEncoder::children() {
    std::vector<std::pair<std::string, Module*>> all = {{"layers", &layers}};
    if (norm) all.push_back({"norm", &*norm});
    return all;
}
Tensor TransformerEncoder::forward(const Tensor& src) { return forward(src, Tensor()); }
Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
    Tensor x = src;
    for (size_t i = 0; i < layers.size(); i++)
        x = layers.at<TransformerEncoderLayer>(i).forward(x, mask, src_key_padding_mask,
                                                          is_causal);
    return norm ? (*norm)(x) : x;
}
TransformerDecoder::TransformerDecoder(TransformerDecoderLayer layer, int64_t num_layers,
                                       std::optional<LayerNorm> norm_, Loc loc)
    : norm(std::move(norm_)) {
    detail::UserLocScope at(loc);
    check_layer_count(num_layers, "TransformerDecoder");
    for (int64_t i = 0; i < num_layers; i++) layers.append(copy_of(layer, loc));
    take_seeds_of_children();
}
std::vector<std::pair<std::string, Module*>> TransformerDecoder::children() {
    std::vector<std::pair<std::string, Module*>> all = {{"layers", &layers}};
    if (norm) all.push_back({"norm", &*norm});
    return all;
}
Tensor TransformerDecoder::forward(const Tensor& x) {
    detail::fail(strf("TransformerDecoder: forward(tgt) alone, tgt %s: it needs the memory, "
                      "forward(tgt, memory, ...)", shape_str(x.shape()).c_str()));
}
Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory,
                                   const Tensor& tgt_mask, const Tensor& memory_mask,
                                   const Tensor& tgt_key_padding_mask,
                                   const Tensor& memory_key_padding_mask, bool tgt_is_causal) {
    Tensor x = tgt;
    for (size_t i = 0; i < layers.size(); i++)
        x = layers.at<TransformerDecoderLayer>(i).forward(x, memory, tgt_mask, memory_mask,
                                                          tgt_key_padding_mask,
                                                          memory_key_padding_mask, tgt_is_causal);
    return norm ? (*norm)(x) : x;
}
std::vector<std::pair<std::string, Module*>> CausalSelfAttention::children() {
    return {{"qkv", &qkv}, {"proj", &proj}, {"attn_drop", &attn_drop}};
}
Tensor CausalSelfAttention::forward(const Tensor& x) {
    if (x.ndim() != 3 || x.size(-1) != dim)
        detail::fail(strf("CausalSelfAttention: input %s is not [batch, time, %lld]",
                          shape_str(x.shape()).c_str(), (long long)dim));
    int64_t B = x.size(0), T = x.size(1), hd = dim / heads;
    std::vector<Tensor> parts = qkv(x).split(dim, -1);
    auto split_heads = [&](const Tensor& t) {
        return t.reshape({B, T, heads, hd}).transpose(1, 2);
    };
    Tensor att = detail::attention_weights(split_heads(parts[0]), split_heads(parts[1]), true,
                                           Loc::here());
    Tensor y = attn_drop(att).matmul(split_heads(parts[2]));
    return proj(y.transpose(1, 2).reshape({B, T, dim}));
}
Tensor Sequential::forward(const Tensor& x) {
    Tensor y = x;
    for (auto& l : layers) y = l->forward(y);
    return y;
}

static Tensor reduce_loss(const Tensor& per_item, Reduction r, const char* op) {
    if (r == Reduction::BATCHMEAN)
        detail::fail(strf("%s: Reduction::BATCHMEAN is kl_div's alone; use MEAN, SUM or NONE",
                          op));
    if (r == Reduction::MEAN) return per_item.mean();
    if (r == Reduction::SUM) return per_item.sum();
    return per_item;
}
static void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape())
        detail::fail(strf("%s: shapes %s and %s differ", op, shape_str(a.shape()).c_str(),
                          shape_str(b.shape()).c_str()));
}
// a float weight [C] for scores [..., C], C their last axis's length
static void check_class_weight(const char* op, const Tensor& weight, const Tensor& scores) {
    if (!weight.defined()) return;
    if (!dtype_is_float(weight.dtype()) || weight.shape() != Shape{scores.size(-1)})
        detail::fail(strf("%s: weight is %s %s; it must be a float tensor of one weight per "
                          "class, [%lld] for scores %s", op, dtype_name(weight.dtype()),
                          shape_str(weight.shape()).c_str(), (long long)scores.size(-1),
                          shape_str(scores.shape()).c_str()));
}
// -Σ_c weight_c·t_c·log_probs_c over the last axis, t a probability per class
static Tensor soft_target_loss(const char* op, const Tensor& log_probs, const Tensor& target,
                               Reduction r, double label_smoothing, const Tensor& weight) {
    Tensor t = label_smoothing == 0 ? target
        : target * (1 - label_smoothing) + label_smoothing / double(log_probs.size(-1));
    Tensor terms = log_probs * t;
    Tensor loss = -(weight.defined() ? terms * weight : terms).sum(-1);
    return reduce_loss(loss, r, op);
}
// -log_probs[target]·weight[target] over the last axis, mixed with the uniform target's loss by
// label_smoothing; the mean divides by the kept targets' weights
static Tensor picked_loss(const char* op, const char* input, const Tensor& scores,
                          const Tensor& target, Reduction r, int64_t ignore_index,
                          double label_smoothing, const Tensor& weight, bool log_softmax,
                          Loc loc) {
    detail::UserLocScope at(loc);
    detail::check_defined(scores, op, loc), detail::check_defined(target, op, loc);
    if (scores.ndim() == 0)
        detail::fail(strf("%s: %s is a scalar; it needs an axis of classes", op, input));
    Shape lead(scores.shape().begin(), scores.shape().end() - 1);
    Shape without_axis_1 = scores.shape();
    if (scores.ndim() >= 3) without_axis_1.erase(without_axis_1.begin() + 1);
    if (scores.ndim() >= 3 && !dtype_is_float(target.dtype()) && target.shape() != lead &&
        target.shape() == without_axis_1)   // PyTorch's [N, C, d...]: classes moved last
        return picked_loss(op, input, scores.movedim(1, -1), target, r, ignore_index,
                           label_smoothing, weight, log_softmax, loc);
    check_class_weight(op, weight, scores);
    if (!(label_smoothing >= 0 && label_smoothing <= 1))
        detail::fail(strf("%s: label_smoothing must be in [0, 1], got %g", op,
                          label_smoothing));
    Tensor log_probs = log_softmax ? scores.log_softmax(-1) : scores;
    if (log_softmax && dtype_is_float(target.dtype())) {   // cross_entropy's alone
        if (ignore_index != -100)
            detail::fail(strf("%s: ignore_index %lld does not apply to probability targets "
                              "(float %s)", op, (long long)ignore_index,
                              shape_str(target.shape()).c_str()));
        if (target.shape() != scores.shape())
            detail::fail(strf("%s: %s %s need int32 or int64 class indices of shape %s or float "
                              "probabilities of shape %s, got %s %s", op, input,
                              shape_str(scores.shape()).c_str(), shape_str(lead).c_str(),
                              shape_str(scores.shape()).c_str(),
                              dtype_name(target.dtype()), shape_str(target.shape()).c_str()));
        return soft_target_loss(op, log_probs, target, r, label_smoothing, weight);
    }
    if (target.dtype() != DType::INT32 && target.dtype() != DType::INT64)
        detail::fail(strf("%s: targets must be int32 or int64 class indices%s, got %s", op,
                          log_softmax ? " or float probabilities" : "",
                          dtype_name(target.dtype())));
    if (target.shape() != lead)
        detail::fail(strf("%s: %s %s need targets of shape %s, got %s", op, input,
                          shape_str(scores.shape()).c_str(), shape_str(lead).c_str(),
                          shape_str(target.shape()).c_str()));
    // an ignored target picks class 0, whose loss is then replaced by 0
    Tensor kept = target != ignore_index, picks = where(kept, target, 0);
    Tensor picked = -log_probs.gather(-1, picks.unsqueeze(-1)).squeeze(-1);
    Tensor kept_weight = kept.cast(scores.dtype());
    if (weight.defined()) {
        Tensor picked_weight = weight.cast(scores.dtype()).gather(0, picks.reshape({-1}));
        picked_weight = picked_weight.reshape(target.shape());
        kept_weight = kept_weight * picked_weight;
        picked = picked * picked_weight;
    }
    Tensor loss = where(kept, picked, 0.0f);
    if (label_smoothing > 0) {
        Tensor every = weight.defined() ? log_probs * weight.cast(scores.dtype()) : log_probs;
        Tensor smooth = where(kept, -every.sum(-1), 0.0f);
        loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / double(scores.size(-1)));
    }
    if (r != Reduction::MEAN) return reduce_loss(loss, r, op);
    return loss.sum() / kept_weight.sum();
}
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction r,
                     int64_t ignore_index, double label_smoothing, const Tensor& weight,
                     Loc loc) {
    return picked_loss("cross_entropy", "logits", logits, target, r, ignore_index,
                       label_smoothing, weight, true, loc);
}
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction r,
                int64_t ignore_index, const Tensor& weight, Loc loc) {
    return picked_loss("nll_loss", "log_probs", log_probs, target, r, ignore_index, 0, weight,
                       false, loc);
}
// weight broadcast to the loss's shape, the loss's unchanged
static Tensor weighed(const char* op, const char* name, const Tensor& loss,
                      const Tensor& weight) {
    if (!weight.defined()) return loss;
    if (!broadcasts_to(weight.shape(), loss.shape()))
        detail::fail(strf("%s: %s %s does not broadcast to the loss's shape %s", op, name,
                          shape_str(weight.shape()).c_str(), shape_str(loss.shape()).c_str()));
    return loss * weight;
}
Tensor binary_cross_entropy(const Tensor& p, const Tensor& t, Reduction r, const Tensor& weight,
                            Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "binary_cross_entropy";
    check_same_shape(op, p, t);
    // Where p(1 - p) >= 1e-12 no logarithm reaches -100, and their own gradient is PyTorch's
    // formula. Elsewhere (p = 1, or p below 1e-12) the loss is the clamped logarithms of p
    // detached, plus (p - t)²/2e-12 less itself detached: 0, with PyTorch's gradient there.
    // The logarithms' side reads 1/2 there, so that no ∞·0 reaches the gradient.
    Tensor edge = p * (1.0f - p) < 1e-12f, held = p.detach();
    Tensor safe = where(edge, 0.5f, p);
    Tensor inside = -(t * safe.log() + (1.0f - t) * (1.0f - safe).log());
    Tensor clamped = -(t * held.log().clamp(-100) + (1.0f - t) * (1.0f - held).log().clamp(-100));
    Tensor pull = ((p - t) * (p - t) - (held - t) * (held - t)) * float(0.5 / 1e-12);
    return reduce_loss(weighed(op, "weight", where(edge, clamped + pull, inside), weight),
                       r, op);
}
// (1 - t)·x - ln σ(x), with ln σ(x) = min(x, 0) - ln(1 + e^-|x|): no overflow for any x. The
// min and |x| take the same side at 0, so the kinks cancel and the gradient is σ(x) - t there too.
Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& t, Reduction r,
                                        const Tensor& weight, const Tensor& pos_weight,
                                        Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "binary_cross_entropy_with_logits";
    check_same_shape(op, x, t);
    Tensor below = x < 0;
    Tensor min0 = where(below, x, 0), abs = where(below, -x, x);
    Tensor log_sigmoid = min0 - ((-abs).exp() + 1.0f).log();
    if (pos_weight.defined())   // 1 + (pos_weight - 1)·t
        log_sigmoid = log_sigmoid * (weighed(op, "pos_weight", t, pos_weight - 1.0f) + 1.0f);
    Tensor loss = (1.0f - t) * x - log_sigmoid;
    return reduce_loss(weighed(op, "weight", loss, weight), r, op);
}
Tensor kl_div(const Tensor& input, const Tensor& t, Reduction r, bool log_target, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("kl_div", input, t);
    Tensor loss;
    if (log_target) {
        loss = t.exp() * (t - input);
    } else {   // t·ln t is 0 at t = 0 (the logarithm sees 1 there: no 0·∞ in the gradient)
        Tensor zero = t == 0;
        loss = where(zero, 0.0f, t * where(zero, 1.0f, t).log()) - t * input;
    }
    if (r != Reduction::BATCHMEAN) return reduce_loss(loss, r, "kl_div");
    return input.ndim() ? loss.sum() / double(input.size(0)) : loss.sum();
}
Tensor mse_loss(const Tensor& p, const Tensor& t, Reduction r, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("mse_loss", p, t);
    Tensor d = p - t;
    return reduce_loss(d * d, r, "mse_loss");
}
Tensor l1_loss(const Tensor& p, const Tensor& t, Reduction r, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("l1_loss", p, t);
    return reduce_loss((p - t).abs(), r, "l1_loss");
}
Tensor smooth_l1_loss(const Tensor& p, const Tensor& t, Reduction r, double beta, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("smooth_l1_loss", p, t);
    if (!(beta >= 0)) detail::fail(strf("smooth_l1_loss: beta must be >= 0, got %g", beta));
    Tensor d = (p - t).abs();
    if (beta == 0) return reduce_loss(d, r, "smooth_l1_loss");
    return reduce_loss(where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), r,
                       "smooth_l1_loss");
}
Tensor huber_loss(const Tensor& p, const Tensor& t, Reduction r, double delta, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("huber_loss", p, t);
    if (!(delta > 0)) detail::fail(strf("huber_loss: delta must be > 0, got %g", delta));
    Tensor d = (p - t).abs();
    return reduce_loss(where(d <= delta, d * d * 0.5, (d - 0.5 * delta) * delta), r,
                       "huber_loss");
}
Tensor hinge_loss(const Tensor& s, const Tensor& y, Reduction r, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("hinge_loss", s, y);
    return reduce_loss((1.0f - y * s).relu(), r, "hinge_loss");
}
// PyTorch clamps these losses with clamp_min, whose gradient passes at the bound itself
Tensor margin_ranking_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                           Reduction r, double margin, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "margin_ranking_loss";
    if (x1.ndim() != x2.ndim() || x1.ndim() != target.ndim())
        detail::fail(strf("%s: x1 %s, x2 %s and target %s must have one rank", op,
                          shape_str(x1.shape()).c_str(), shape_str(x2.shape()).c_str(),
                          shape_str(target.shape()).c_str()));
    broadcast_shape(broadcast_shape(x1.shape(), x2.shape(), op, loc), target.shape(), op, loc);
    return reduce_loss((margin - target * (x1 - x2)).clamp(0), r, op);
}
Tensor hinge_embedding_loss(const Tensor& x, const Tensor& target, Reduction r, double margin,
                            Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("hinge_embedding_loss", x, target);
    Tensor beyond_margin = where(target != 1, (margin - x).clamp(0), 0);
    return reduce_loss(beyond_margin + where(target != -1, x, 0), r, "hinge_embedding_loss");
}
Tensor soft_margin_loss(const Tensor& x, const Tensor& target, Reduction r, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("soft_margin_loss", x, target);
    return reduce_loss((-target * x).exp().log1p(), r, "soft_margin_loss");
}
Tensor multilabel_soft_margin_loss(const Tensor& x, const Tensor& target, Reduction r,
                                   const Tensor& weight, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "multilabel_soft_margin_loss";
    check_same_shape(op, x, target);
    if (x.ndim() == 0) detail::fail(strf("%s: x is a scalar; it needs an axis of classes", op));
    check_class_weight(op, weight, x);
    Tensor loss = -(target * functional::logsigmoid(x) + (1 - target) * functional::logsigmoid(-x));
    if (weight.defined()) loss = loss * weight;
    return reduce_loss(loss.sum(-1) / double(x.size(-1)), r, op);
}
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             Reduction r, double margin, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "cosine_embedding_loss";
    const int rows = target.ndim();
    if (rows > 1 || x1.ndim() != rows + 1 || x2.ndim() != rows + 1 ||
        (rows == 1 && (x1.size(0) != target.size(0) || x2.size(0) != target.size(0))))
        detail::fail(strf("%s: x1 %s, x2 %s and target %s: x1 and x2 [N, D] need a target [N], "
                          "[D] a scalar one", op, shape_str(x1.shape()).c_str(),
                          shape_str(x2.shape()).c_str(), shape_str(target.shape()).c_str()));
    const int axis = rows;
    Tensor squares1 = (x1 * x1).sum(axis) + 1e-12, squares2 = (x2 * x2).sum(axis) + 1e-12;
    Tensor cos = (x1 * x2).sum(axis) / (squares1 * squares2).sqrt();
    Tensor loss = where(target == 1, 1 - cos, 0) + where(target == -1, (cos - margin).clamp(0), 0);
    return reduce_loss(loss, r, op);
}
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim,
                         Loc loc) {
    detail::UserLocScope at(loc);
    broadcast_shape(x1.shape(), x2.shape(), "pairwise_distance", loc);
    if (std::max(x1.ndim(), x2.ndim()) == 0)
        detail::fail("pairwise_distance: x1 and x2 are scalars; it needs an axis", loc);
    return (x1 - x2 + eps).norm(p, -1, keepdim);
}
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           Reduction r, double margin, double p, double eps, bool swap,
                           Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "triplet_margin_loss";
    if (!(p > 0)) detail::fail(strf("%s: p must be > 0, got %g", op, p));
    if (anchor.ndim() != positive.ndim() || anchor.ndim() != negative.ndim())
        detail::fail(strf("%s: anchor %s, positive %s and negative %s must have one rank", op,
                          shape_str(anchor.shape()).c_str(), shape_str(positive.shape()).c_str(),
                          shape_str(negative.shape()).c_str()));
    Tensor to_positive = pairwise_distance(anchor, positive, p, eps, false, loc);
    Tensor to_negative = pairwise_distance(anchor, negative, p, eps, false, loc);
    if (swap) to_negative = to_negative.minimum(pairwise_distance(positive, negative, p, eps));
    return reduce_loss((margin + to_positive - to_negative).clamp(0), r, op);
}
Tensor gaussian_nll_loss(const Tensor& x, const Tensor& target, const Tensor& var, Reduction r,
                         bool full, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "gaussian_nll_loss";
    check_same_shape(op, x, target);
    if (!(eps >= 0)) detail::fail(strf("%s: eps must be at least 0, got %g", op, eps));
    const Shape& xs = x.shape();
    Shape lead(xs.begin(), xs.end() - (xs.empty() ? 0 : 1));
    Shape lead_and_one = lead;
    lead_and_one.push_back(1);
    if (var.shape() != xs && var.shape() != lead_and_one && var.shape() != lead)
        detail::fail(strf("%s: var %s must be x's shape %s, or that with its last axis 1 or "
                          "dropped", op, shape_str(var.shape()).c_str(), shape_str(xs).c_str()));
    Tensor v = var.shape() == lead && var.shape() != xs ? var.unsqueeze(-1) : var;
    v = v.clamp(eps).detach() + (v - v.detach());   // the clamp's value, v's gradient
    Tensor d = x - target;
    Tensor loss = (v.log() + d * d / v) * 0.5;
    if (full) loss = loss + 0.5 * std::log(2 * detail::PI);
    return reduce_loss(loss, r, op);
}
Tensor poisson_nll_loss(const Tensor& x, const Tensor& target, Reduction r, bool log_input,
                        bool full, double eps, Loc loc) {
    detail::UserLocScope at(loc);
    check_same_shape("poisson_nll_loss", x, target);
    Tensor loss = log_input ? x.exp() - target * x : x - target * (x + eps).log();
    if (full) {
        Tensor stirling = target * target.log() - target + (target * (2 * detail::PI)).log() * 0.5;
        loss = loss + where(target > 1, stirling, 0);
    }
    return reduce_loss(loss, r, "poisson_nll_loss");
}
Tensor multi_margin_loss(const Tensor& x, const Tensor& target, Reduction r, double p,
                         double margin, const Tensor& weight, Loc loc) {
    detail::UserLocScope at(loc);
    const char* op = "multi_margin_loss";
    if (p != 1 && p != 2) detail::fail(strf("%s: p must be 1 or 2, got %g", op, p));
    if (target.dtype() != DType::INT32 && target.dtype() != DType::INT64)
        detail::fail(strf("%s: target must hold int32 or int64 classes, got %s", op,
                          dtype_name(target.dtype())));
    if (x.ndim() < 1 || x.ndim() > 2 || target.ndim() != x.ndim() - 1 ||
        (x.ndim() == 2 && target.size(0) != x.size(0)))
        detail::fail(strf("%s: x %s needs target %s: x [N, C] with target [N], or [C] with a "
                          "scalar", op, shape_str(x.shape()).c_str(),
                          shape_str(target.shape()).c_str()));
    check_class_weight(op, weight, x);
    const int64_t classes = x.size(-1);
    Tensor rows = x.ndim() == 2 ? x : x.unsqueeze(0);
    Tensor y = target.reshape({rows.size(0), 1});
    Tensor z = rows - rows.gather(1, y) + margin;
    Tensor counted = logical_and(z > 0, Tensor::arange(classes).reshape({1, classes}) != y);
    Tensor terms = where(counted, p == 1 ? z : z * z, 0);
    if (weight.defined())
        terms = terms * weight.cast(x.dtype()).gather(0, y.reshape({-1})).unsqueeze(1);
    Tensor loss = terms.sum(1) / double(classes);
    return reduce_loss(x.ndim() == 2 ? loss : loss.reshape({}), r, op);
}
}  // namespace nn

// ---- [OPTIM] optimizers ----------------------------------------------------------------- >>optim
// step() builds every update as an assignment (in the UPDATE phase, tracking no gradients) and
// realizes them together, with whatever backward() left pending, as one program. State lives
// in realized tensors, so a jitted step replays it correctly. Tests: tests/test_training.cpp.
namespace optim {
static Tensor scalar_tensor(double v) {
    return Tensor::from_vector(std::vector<float>{float(v)}, {});
}
// Steps a parameter had no gradient in (0 at first, where it lives), so that t less it is the
// parameter's own count, as PyTorch keeps one: it changes only in such a step, so that the
// usual step, every parameter with a gradient, reads it and writes nothing more
static Tensor skipped_steps_of(const Tensor& p) {
    return on_device_of(p, scalar_tensor(0), Loc::here()).realize();
}
// this step's count for parameter i (its update follows), or the skip noted in out (none)
static std::optional<Tensor> own_step(const Tensor& step_t, Tensor& skipped, bool has_grad,
                                      std::vector<Tensor>& out) {
    if (has_grad) return step_t - skipped;
    out.push_back(skipped.assign(skipped + 1.0f));
    return std::nullopt;
}

// Every parameter must be able to receive a gradient: a leaf that requires grad.
// lr(t) = peak·t/warmup up to warmup; then min + (peak - min)·(1 + cos(π·p))/2, p the part of
// the decay done, clamped to [0, 1]
Schedule warmup_cosine(double peak, int64_t warmup, int64_t total, double min_lr, Loc loc) {
    if (warmup < 0 || total <= warmup)
        detail::fail(strf("warmup_cosine: need 0 <= warmup < total, got warmup %lld, total %lld",
                          (long long)warmup, (long long)total), loc);
    return [=](const Tensor& t) {
        Tensor rising = t * float(peak / double(std::max<int64_t>(warmup, 1)));
        Tensor done = ((t - float(warmup)) * float(1.0 / double(total - warmup))).clamp(0.0, 1.0);
        Tensor falling = ((done * float(detail::PI)).cos() + 1.0f) * float((peak - min_lr) / 2) +
                         float(min_lr);
        return where(t <= float(warmup), rising, falling);
    };
}

// gamma^k = 2^(k·log2 gamma): k stays a tensor (gamma > 0)
static Tensor power_of(double gamma, const Tensor& k) {
    return (k * float(std::log2(gamma))).exp2();
}
Schedule step_lr(double lr, int64_t step_size, double gamma, Loc loc) {
    if (step_size < 1 || !(gamma > 0))
        detail::fail(strf("step_lr: need step_size >= 1 and gamma > 0, got step_size %lld, "
                          "gamma %g", (long long)step_size, gamma), loc);
    return [=](const Tensor& t) {
        // (t - 1/2)/step_size, not (t - 1)/step_size: a rounded 41·(1/41) is just below 1
        return power_of(gamma, ((t - 0.5f) * float(1.0 / double(step_size))).floor()) * float(lr);
    };
}
Schedule exponential_lr(double lr, double gamma, Loc loc) {
    if (!(gamma > 0)) detail::fail(strf("exponential_lr: need gamma > 0, got %g", gamma), loc);
    return [=](const Tensor& t) { return power_of(gamma, t - 1.0f) * float(lr); };
}
Schedule cosine_annealing_lr(double lr, int64_t t_max, double eta_min, Loc loc) {
    if (t_max < 1)
        detail::fail(strf("cosine_annealing_lr: need t_max >= 1, got %lld", (long long)t_max),
                     loc);
    return [=](const Tensor& t) {
        Tensor angle = (t - 1.0f) * float(detail::PI / double(t_max));
        return (angle.cos() + 1.0f) * float((lr - eta_min) / 2) + float(eta_min);
    };
}
Schedule linear_lr(double lr, double start_factor, double end_factor, int64_t total_iters,
                   Loc loc) {
    if (total_iters < 1 || !(start_factor > 0 && start_factor <= 1) ||
        !(end_factor >= 0 && end_factor <= 1))
        detail::fail(strf("linear_lr: need 0 < start_factor <= 1, 0 <= end_factor <= 1 and "
                          "total_iters >= 1, got %g, %g, %lld", start_factor, end_factor,
                          (long long)total_iters), loc);
    return [=](const Tensor& t) {
        Tensor done = ((t - 1.0f) * float(1.0 / double(total_iters))).clamp(0.0, 1.0);
        return (done * float(end_factor - start_factor) + float(start_factor)) * float(lr);
    };
}

Schedule multi_step_lr(double lr, std::vector<int64_t> milestones, double gamma, Loc loc) {
    if (!(gamma >= 0)) detail::fail(strf("multi_step_lr: need gamma >= 0, got %g", gamma), loc);
    return [=](const Tensor& t) {
        Tensor passed = Tensor::zeros_like(t);   // milestones at most t - 1
        for (int64_t m : milestones) passed = passed + (t - 0.5f >= float(m)).cast(DType::FLOAT32);
        if (gamma == 0) return where(passed > 0, 0.0f, Tensor::full_like(t, lr));
        return power_of(gamma, passed) * float(lr);
    };
}
// PyTorch's phases over s = t - 1 scheduler steps: each from its start rate at s = its start
// to its end rate at s = its end, the first ending at pct_start·total - 1, the last at total - 1
Schedule one_cycle_lr(double max_lr, int64_t total, double pct_start, bool cosine, double div,
                      double final_div, bool three_phase, Loc loc) {
    struct Phase { double end, from, to; };
    double first = max_lr / div, last = first / final_div, up = pct_start * double(total) - 1;
    std::vector<Phase> phases = {{up, first, max_lr}, {double(total) - 1, max_lr, last}};
    if (three_phase)
        phases = {{up, first, max_lr}, {2 * up, max_lr, first}, {double(total) - 1, first, last}};
    // as PyTorch's: a phase may end before it starts (then no step is in it), but not where
    bool ordered = total >= 1 && pct_start >= 0 && pct_start <= 1 && div > 0 && final_div > 0;
    for (size_t i = 0; i < phases.size(); i++)
        ordered = ordered && phases[i].end != (i ? phases[i - 1].end : 0);
    if (!ordered)
        detail::fail(strf("one_cycle_lr: total_steps %lld, pct_start %g, div_factor %g and "
                          "final_div_factor %g leave a phase that ends where it starts (or a "
                          "factor not above 0)", (long long)total, pct_start, div, final_div),
                     loc);
    return [=](const Tensor& t) {
        Tensor s = t - 1.0f, rate;
        for (size_t i = phases.size(); i-- > 0;) {
            double start = i ? phases[i - 1].end : 0;
            const Phase& ph = phases[i];
            Tensor done = ((s - float(start)) * float(1 / (ph.end - start))).clamp(0.0, 1.0);
            // (1 + cos πd)/2 as cos²(πd/2), and the linear mix weighted at both ends: each
            // phase's last rate stays precise in float32
            Tensor c = (done * float(detail::PI / 2)).cos();
            Tensor here = cosine ? c * c * float(ph.from - ph.to) + float(ph.to)
                                 : (1.0f - done) * float(ph.from) + done * float(ph.to);
            rate = rate.defined() ? where(s <= float(ph.end), here, rate) : here;
        }
        return rate;
    };
}

Schedule constant_lr(double lr, double factor, int64_t total_iters, Loc loc) {
    if (!(factor >= 0 && factor <= 1) || total_iters < 0)
        detail::fail(strf("constant_lr: need 0 <= factor <= 1 and total_iters >= 0, got %g, %lld",
                          factor, (long long)total_iters), loc);
    return [=](const Tensor& t) {
        return where(t <= float(total_iters), Tensor::full_like(t, lr * factor), float(lr));
    };
}
Schedule polynomial_lr(double lr, int64_t total_iters, double power, Loc loc) {
    if (total_iters < 1 || !(power >= 0))
        detail::fail(strf("polynomial_lr: need total_iters >= 1 and power >= 0, got %lld, %g",
                          (long long)total_iters, power), loc);
    return [=](const Tensor& t) {
        Tensor left = 1.0f - ((t - 1.0f) * float(1.0 / double(total_iters))).clamp(0.0, 1.0);
        return left.pow(power) * float(lr);
    };
}
// Restart k begins after t_0·(1 + t_mult + ... + t_mult^(k-1)) steps: whole numbers, exact in
// float32 to 2^24, summed as steps pass them (no logarithm to round at a restart)
Schedule cosine_annealing_warm_restarts(double lr, int64_t t_0, int64_t t_mult, double eta_min,
                                        Loc loc) {
    if (t_0 < 1 || t_mult < 1)
        detail::fail(strf("cosine_annealing_warm_restarts: need t_0 >= 1 and t_mult >= 1, got "
                          "%lld, %lld", (long long)t_0, (long long)t_mult), loc);
    return [=](const Tensor& t) {
        Tensor e = t - 1.0f, into, period;
        if (t_mult == 1) {
            into = e % float(t_0);
            period = Tensor::full_like(e, double(t_0));
        } else {
            into = e;
            period = Tensor::full_like(e, double(t_0));
            double start = 0, length = double(t_0);
            while (start + length < 16777216) {   // 2^24
                start += length;
                Tensor passed = e >= float(start);
                into = where(passed, e - float(start), into);
                period = where(passed, float(length * double(t_mult)), period);
                length *= double(t_mult);
            }
        }
        Tensor c = (into / period * float(detail::PI)).cos();
        return (c + 1.0f) * float((lr - eta_min) / 2) + float(eta_min);
    };
}
Schedule cyclic_lr(double base_lr, double max_lr, int64_t up, std::optional<int64_t> down_given,
                   const std::string& mode, double gamma, Loc loc) {
    const int64_t down = down_given.value_or(up);
    if (up < 1 || down < 1 || !(gamma > 0) ||
        (mode != "triangular" && mode != "triangular2" && mode != "exp_range"))
        detail::fail(strf("cyclic_lr: need step sizes >= 1, gamma > 0 and mode triangular, "
                          "triangular2 or exp_range, got %lld, %lld, %g, \"%s\"", (long long)up,
                          (long long)down, gamma, mode.c_str()), loc);
    return [=](const Tensor& t) {
        const float total = float(up + down);
        Tensor e = t - 1.0f, at = e % total;   // steps into this cycle
        Tensor scale = where(at <= float(up), at * float(1.0 / double(up)),
                             (total - at) * float(1.0 / double(down)));
        Tensor height = scale * float(max_lr - base_lr);
        if (mode == "triangular2")   // 1 / 2^(cycles before this one)
            height = height * (-((e - at) / total)).exp2();
        if (mode == "exp_range") height = height * power_of(gamma, e);
        return height + float(base_lr);
    };
}

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& opt, bool max, double f, int64_t wait,
                                     double th, bool relative, int64_t cool, double least,
                                     double e, Loc loc)
    : optimizer(opt), maximize(max), relative_threshold(relative), factor(f), threshold(th),
      min_lr(least), eps(e), patience(wait), cooldown(cool), best(max ? -INFINITY : INFINITY) {
    if (!(factor < 1 && factor >= 0) || patience < 0 || cooldown < 0 || !(threshold >= 0) ||
        !(min_lr >= 0) || !(eps >= 0))
        detail::fail(strf("ReduceLROnPlateau: need 0 <= factor < 1 and patience, cooldown, "
                          "threshold, min_lr and eps at least 0; got factor %g, patience %lld, "
                          "cooldown %lld, threshold %g, min_lr %g, eps %g", factor,
                          (long long)patience, (long long)cooldown, threshold, min_lr, eps),
                     loc);
}
void ReduceLROnPlateau::step(double metric, Loc loc) {
    double bar = relative_threshold ? best * (maximize ? 1 + threshold : 1 - threshold)
                                    : best + (maximize ? threshold : -threshold);
    if (maximize ? metric > bar : metric < bar) best = metric, bad_steps = 0;
    else bad_steps++;
    if (cooldown_left > 0) cooldown_left--, bad_steps = 0;
    if (bad_steps <= patience) return;
    double lr = optimizer.lr.item(loc), lower = std::max(lr * factor, min_lr);
    if (lr - lower > eps) optimizer.set_lr(lower, loc);
    cooldown_left = cooldown, bad_steps = 0;
}

// PyTorch's checks of the settings: none negative (or NaN)
static void check_at_least_0(const char* who, const char* name, double value) {
    if (!(value >= 0)) detail::fail(strf("%s: %s must be at least 0, got %g", who, name, value));
}
static void check_betas(const char* who, double beta1, double beta2) {
    for (double beta : {beta1, beta2})
        if (!(beta >= 0 && beta < 1))
            detail::fail(strf("%s: betas must be in [0, 1), got %g and %g", who, beta1, beta2));
}


Optimizer::Optimizer(std::vector<Tensor> ps, double learning_rate, Loc loc)
    : params(std::move(ps)) {
    detail::UserLocScope at(loc);
    check_at_least_0("optimizer", "lr", learning_rate);
    if (params.empty())
        detail::fail("optimizer: no parameters (a layer that learns its input width, such as "
                     "nn::Linear(out), has none until its first call)");
    for (size_t i = 0; i < params.size(); i++) {
        const detail::Node& n = *params[i].node();
        if (n.leaf) continue;
        detail::fail(strf("optimizer: parameter %zu (%s %s, made at %s) %s", i,
                          dtype_name(n.dtype), shape_str(n.shape).c_str(),
                          detail::loc_str(n.loc).c_str(),
                          n.requires_grad ? "is computed from other tensors, so backward() never "
                                            "fills its grad(): pass the leaf tensors"
                                          : "does not require grad: call requires_grad() on it"));
    }
    // on the parameters' device: the update reads them there
    lr = on_device_of(params[0], scalar_tensor(learning_rate), Loc::here());
    t = on_device_of(params[0], scalar_tensor(0), Loc::here());
}
void Optimizer::step(Loc loc) {
    detail::UserLocScope at(loc);
    const detail::Device* state_on = detail::node_device(lr.node().get());
    for (size_t i = 0; i < params.size(); i++)
        if (detail::node_device(params[i].node().get()) != state_on)
            detail::fail(strf("optimizer: parameter %zu is on %s, its state on %s: the layer "
                              "moved (Module::to) after the optimizer was made; make it after",
                              i, params[i].device().c_str(), lr.device().c_str()));
    std::vector<Tensor> assigns;
    {
        NoGrad no_grad;
        detail::PhaseScope phase(detail::Phase::UPDATE);
        step_t = t.assign(t + 1.0f);
        step_lr = schedule ? schedule(step_t).cast(DType::FLOAT32) : lr;
        assigns = updates();
        assigns.push_back(step_t);
    }
    std::vector<detail::NodeP> nodes;
    for (const Tensor& a : assigns) nodes.push_back(a.node());
    detail::realize_nodes(nodes, false, true);
}
std::map<std::string, Tensor> Optimizer::state_dict() {
    std::map<std::string, Tensor> out{{"t", t}, {"lr", lr}};
    std::vector<std::vector<std::pair<std::string, Tensor>>> state = param_state();
    for (size_t i = 0; i < state.size(); i++)
        for (auto& [name, tensor] : state[i])
            out[strf("state.%zu.%s", i, name.c_str())] = tensor;
    return out;
}
void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state, Loc loc) {
    detail::UserLocScope at(loc);
    std::map<std::string, Tensor> mine = state_dict();
    // a state saved before parameters counted their skipped steps holds none: 0 each, as
    // every parameter's count was the optimizer's then
    auto skips = [](const std::string& name) {
        return name.size() > 8 && name.compare(name.size() - 8, 8, ".skipped") == 0;
    };
    for (auto& [name, tensor] : mine) {
        auto it = state.find(name);
        if (it == state.end() && skips(name)) continue;
        if (it == state.end())
            detail::fail("optimizer load_state_dict: " + name + " is missing from the state");
        if (it->second.shape() != tensor.shape())
            detail::fail(strf("optimizer load_state_dict: %s is %s here but %s in the state",
                              name.c_str(), shape_str(tensor.shape()).c_str(),
                              shape_str(it->second.shape()).c_str()));
    }
    for (auto& [name, tensor] : state)
        if (!mine.count(name))
            detail::fail("optimizer load_state_dict: " + name + " is not in this optimizer");
    std::vector<Tensor> assigns;
    for (auto& [name, tensor] : mine) {
        auto it = state.find(name);
        Tensor v = it != state.end() ? it->second : Tensor::zeros_like(tensor);
        assigns.push_back(tensor.assign(v.device() == tensor.device() ? v : v.to(tensor.device())));
    }
    realize(assigns);
}
void Optimizer::zero_grad() {
    for (Tensor& p : params) p.zero_grad();
}
std::vector<Tensor> params_of(const std::vector<ParamGroup>& groups) {
    std::vector<Tensor> out;
    for (const ParamGroup& g : groups) out.insert(out.end(), g.params.begin(), g.params.end());
    return out;
}
void Optimizer::set_groups(const std::vector<ParamGroup>& groups, double base_lr,
                           const char* who, Loc loc) {
    detail::UserLocScope at(loc);
    std::map<const detail::Node*, size_t> group_of;
    for (size_t gi = 0; gi < groups.size(); gi++) {
        const ParamGroup& g = groups[gi];
        if (g.lr) check_at_least_0(who, strf("group %zu's lr", gi).c_str(), *g.lr);
        if (g.lr && *g.lr != base_lr && base_lr == 0)
            detail::fail(strf("%s: group %zu's lr %g follows the optimizer's, which is 0: give "
                              "the optimizer an lr above 0", who, gi, *g.lr));
        if (g.weight_decay)
            check_at_least_0(who, strf("group %zu's weight_decay", gi).c_str(), *g.weight_decay);
        for (const Tensor& p : g.params) {
            auto [it, fresh] = group_of.insert({p.node().get(), gi});
            if (!fresh)
                detail::fail(strf("%s: a parameter (%s) is in groups %zu and %zu", who,
                                  shape_str(p.shape()).c_str(), it->second, gi));
            bool own_lr = g.lr && float(*g.lr) != float(base_lr);
            lr_scales.push_back(own_lr ? *g.lr / base_lr : 1.0);
            weight_decays.push_back(g.weight_decay);
        }
    }
}
Tensor Optimizer::lr_of(size_t i) const {
    double scale = i < lr_scales.size() ? lr_scales[i] : 1.0;
    return scale == 1.0 ? step_lr : step_lr * float(scale);
}
double Optimizer::weight_decay_of(size_t i, double optimizers) const {
    return i < weight_decays.size() && weight_decays[i] ? *weight_decays[i] : optimizers;
}
void Optimizer::set_lr(double value, Loc loc) {
    detail::UserLocScope at(loc);
    check_at_least_0("set_lr", "lr", value);
    float v = float(value);
    detail::await_buffer(*lr.node()->buffer);
    lr.node()->buffer->device->copy_in(lr.node()->buffer->ptr, &v, sizeof v);
}

SGD::SGD(std::vector<Tensor> ps, double learning_rate, double mom, double wd, bool nest,
         double damp, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc),
      momentum(mom),
      weight_decay(wd),
      nesterov(nest),
      dampening(damp) {
    detail::UserLocScope at(loc);
    check_at_least_0("SGD", "momentum", momentum);
    check_at_least_0("SGD", "weight_decay", weight_decay);
    check_at_least_0("SGD", "dampening", dampening);
    if (nesterov && (momentum == 0 || dampening != 0))
        detail::fail("SGD: nesterov needs a momentum above 0 and no dampening");
    if (momentum == 0) return;
    for (const Tensor& p : params) {
        buffers.push_back(Tensor::zeros_like(p).realize());
        if (dampening != 0) skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> SGD::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        std::optional<Tensor> t;   // with dampening, the parameter's own step
        if (!skipped.empty()) t = own_step(step_t, skipped[i], g.defined(), out);
        if (!g.defined()) continue;
        double wd = weight_decay_of(i, weight_decay);
        Tensor d = wd != 0 ? g + p * float(wd) : g;
        if (momentum != 0) {
            Tensor b = buffers[i] * float(momentum) + d;   // from 0, the first step's is d
            if (t) b = where(*t < 1.5f, d, buffers[i] * float(momentum) + d * float(1 - dampening));
            b = buffers[i].assign(b);
            out.push_back(b);
            d = nesterov ? d + b * float(momentum) : b;
        }
        out.push_back(p.assign(p - lr_of(i) * d));
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> SGD::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out(params.size());
    for (size_t i = 0; i < buffers.size(); i++) out[i] = {{"momentum_buffer", buffers[i]}};
    for (size_t i = 0; i < skipped.size(); i++) out[i].push_back({"skipped", skipped[i]});
    return out;
}

Adam::Adam(std::vector<Tensor> ps, double learning_rate, double b1, double b2, double e, double wd,
           bool dec, bool ams, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc),
      beta1(b1),
      beta2(b2),
      eps(e),
      weight_decay(wd),
      decoupled(dec),
      amsgrad(ams) {
    detail::UserLocScope at(loc);
    const char* who = decoupled ? "AdamW" : "Adam";
    check_betas(who, beta1, beta2);
    check_at_least_0(who, "eps", eps);
    check_at_least_0(who, "weight_decay", weight_decay);
    for (const Tensor& p : params) {
        m.push_back(Tensor::zeros_like(p).realize());
        v.push_back(Tensor::zeros_like(p).realize());
        if (amsgrad) v_max.push_back(Tensor::zeros_like(p).realize());
        skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> Adam::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = params[i].grad();
        std::optional<Tensor> t = own_step(step_t, skipped[i], g.defined(), out);
        if (!t) continue;
        Tensor c1 = 1.0f - power_of(beta1, *t), c2 = 1.0f - power_of(beta2, *t);
        double wd = weight_decay_of(i, weight_decay);
        if (wd != 0 && !decoupled) g = g + p * float(wd);
        Tensor mi = m[i].assign(m[i] * float(beta1) + g * float(1 - beta1));
        Tensor vi = v[i].assign(v[i] * float(beta2) + g * g * float(1 - beta2));
        out.insert(out.end(), {mi, vi});
        if (amsgrad) out.push_back(vi = v_max[i].assign(v_max[i].maximum(vi)));
        Tensor update = (mi / c1) / ((vi / c2).sqrt() + float(eps));
        if (wd != 0 && decoupled) update = update + p * float(wd);
        out.push_back(p.assign(p - lr_of(i) * update));
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> Adam::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < params.size(); i++)
        out.push_back({{"exp_avg", m[i]}, {"exp_avg_sq", v[i]}, {"skipped", skipped[i]}});
    if (amsgrad)
        for (size_t i = 0; i < params.size(); i++) out[i].push_back({"max_exp_avg_sq", v_max[i]});
    return out;
}

RMSprop::RMSprop(std::vector<Tensor> ps, double learning_rate, double a, double e, double wd,
                 double mom, bool c, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc),
      alpha(a),
      eps(e),
      weight_decay(wd),
      momentum(mom),
      centered(c) {
    detail::UserLocScope at(loc);
    check_at_least_0("RMSprop", "alpha", alpha);
    check_at_least_0("RMSprop", "eps", eps);
    check_at_least_0("RMSprop", "weight_decay", weight_decay);
    check_at_least_0("RMSprop", "momentum", momentum);
    for (const Tensor& p : params) {
        square_avg.push_back(Tensor::zeros_like(p).realize());
        if (centered) grad_avg.push_back(Tensor::zeros_like(p).realize());
        if (momentum != 0) buffers.push_back(Tensor::zeros_like(p).realize());
    }
}
std::vector<Tensor> RMSprop::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        if (!g.defined()) continue;
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        Tensor v = square_avg[i].assign(square_avg[i] * float(alpha) + g * g * float(1 - alpha));
        out.push_back(v);
        if (centered) {
            Tensor mean = grad_avg[i].assign(grad_avg[i] * float(alpha) + g * float(1 - alpha));
            out.push_back(mean);
            v = v - mean * mean;
        }
        Tensor d = g / (v.sqrt() + float(eps));
        if (momentum != 0) {
            d = buffers[i].assign(buffers[i] * float(momentum) + d);
            out.push_back(d);
        }
        out.push_back(p.assign(p - lr_of(i) * d));
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> RMSprop::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out(params.size());
    for (size_t i = 0; i < params.size(); i++) {
        out[i] = {{"square_avg", square_avg[i]}};
        if (centered) out[i].push_back({"grad_avg", grad_avg[i]});
        if (momentum != 0) out[i].push_back({"momentum_buffer", buffers[i]});
    }
    return out;
}

Adagrad::Adagrad(std::vector<Tensor> ps, double learning_rate, double decay, double wd,
                 double initial, double e, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc), lr_decay(decay), weight_decay(wd), eps(e) {
    detail::UserLocScope at(loc);
    check_at_least_0("Adagrad", "lr_decay", lr_decay);
    check_at_least_0("Adagrad", "weight_decay", weight_decay);
    check_at_least_0("Adagrad", "initial_accumulator_value", initial);
    check_at_least_0("Adagrad", "eps", eps);
    for (const Tensor& p : params) {
        sums.push_back(Tensor::full_like(p, initial).realize());
        skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> Adagrad::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        std::optional<Tensor> t = own_step(step_t, skipped[i], g.defined(), out);
        if (!t) continue;
        Tensor lr_t = lr_of(i) / ((*t - 1.0f) * float(lr_decay) + 1.0f);
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        Tensor sum = sums[i].assign(sums[i] + g * g);
        out.insert(out.end(), {sum, p.assign(p - lr_t * (g / (sum.sqrt() + float(eps))))});
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> Adagrad::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < sums.size(); i++)
        out.push_back({{"sum", sums[i]}, {"skipped", skipped[i]}});
    return out;
}

Adamax::Adamax(std::vector<Tensor> ps, double learning_rate, double b1, double b2, double e,
               double wd, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc), beta1(b1), beta2(b2), eps(e),
      weight_decay(wd) {
    detail::UserLocScope at(loc);
    check_betas("Adamax", beta1, beta2);
    check_at_least_0("Adamax", "eps", eps);
    check_at_least_0("Adamax", "weight_decay", weight_decay);
    for (const Tensor& p : params) {
        m.push_back(Tensor::zeros_like(p).realize());
        u.push_back(Tensor::zeros_like(p).realize());
        skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> Adamax::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        std::optional<Tensor> t = own_step(step_t, skipped[i], g.defined(), out);
        if (!t) continue;
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        Tensor mi = m[i].assign(m[i] * float(beta1) + g * float(1 - beta1));
        Tensor ui = u[i].assign((u[i] * float(beta2)).maximum(g.abs() + float(eps)));
        Tensor step_size = lr_of(i) / (1.0f - power_of(beta1, *t));
        out.insert(out.end(), {mi, ui, p.assign(p - step_size * (mi / ui))});
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> Adamax::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < params.size(); i++)
        out.push_back({{"exp_avg", m[i]}, {"exp_inf", u[i]}, {"skipped", skipped[i]}});
    return out;
}

NAdam::NAdam(std::vector<Tensor> ps, double learning_rate, double b1, double b2, double e,
             double wd, double decay, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc), beta1(b1), beta2(b2), eps(e),
      weight_decay(wd), momentum_decay(decay) {
    detail::UserLocScope at(loc);
    check_betas("NAdam", beta1, beta2);
    check_at_least_0("NAdam", "eps", eps);
    check_at_least_0("NAdam", "weight_decay", weight_decay);
    check_at_least_0("NAdam", "momentum_decay", momentum_decay);
    for (const Tensor& p : params) {
        m.push_back(Tensor::zeros_like(p).realize());
        v.push_back(Tensor::zeros_like(p).realize());
        mu_product.push_back(on_device_of(p, scalar_tensor(1), loc).realize());
        skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> NAdam::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        std::optional<Tensor> t = own_step(step_t, skipped[i], g.defined(), out);
        if (!t) continue;
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        auto mu_at = [&](const Tensor& step) {
            return (1.0f - power_of(0.96, step * float(momentum_decay)) * 0.5f) * float(beta1);
        };
        Tensor mu = mu_at(*t), mu_next = mu_at(*t + 1.0f);
        Tensor product = mu_product[i].assign(mu_product[i] * mu);
        Tensor mi = m[i].assign(m[i] * float(beta1) + g * float(1 - beta1));
        Tensor vi = v[i].assign(v[i] * float(beta2) + g * g * float(1 - beta2));
        Tensor d = (vi / (1.0f - power_of(beta2, *t))).sqrt() + float(eps);
        Tensor lr_i = lr_of(i);
        Tensor step = lr_i * (1.0f - mu) / (1.0f - product) * (g / d) +
                      lr_i * mu_next / (1.0f - product * mu_next) * (mi / d);
        out.insert(out.end(), {product, mi, vi, p.assign(p - step)});
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> NAdam::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < params.size(); i++)
        out.push_back({{"exp_avg", m[i]},
                       {"exp_avg_sq", v[i]},
                       {"mu_product", mu_product[i]},
                       {"skipped", skipped[i]}});
    return out;
}

RAdam::RAdam(std::vector<Tensor> ps, double learning_rate, double b1, double b2, double e,
             double wd, Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc), beta1(b1), beta2(b2), eps(e),
      weight_decay(wd) {
    detail::UserLocScope at(loc);
    check_betas("RAdam", beta1, beta2);
    check_at_least_0("RAdam", "eps", eps);
    check_at_least_0("RAdam", "weight_decay", weight_decay);
    for (const Tensor& p : params) {
        m.push_back(Tensor::zeros_like(p).realize());
        v.push_back(Tensor::zeros_like(p).realize());
        skipped.push_back(skipped_steps_of(p));
    }
}
std::vector<Tensor> RAdam::updates() {
    std::vector<Tensor> out;
    const double rho_inf = 2 / (1 - beta2) - 1;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        std::optional<Tensor> t32 = own_step(step_t, skipped[i], g.defined(), out);
        if (!t32) continue;
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        Tensor mi = m[i].assign(m[i] * float(beta1) + g * float(1 - beta1));
        Tensor vi = v[i].assign(v[i] * float(beta2) + g * g * float(1 - beta2));
        Tensor t = t32->cast(DType::FLOAT64), beta2_t = power_of(beta2, t);
        Tensor c1 = 1.0 - power_of(beta1, t), c2 = 1.0 - beta2_t;
        Tensor rho = rho_inf - t * beta2_t * 2.0 / c2;
        Tensor rectified = ((rho - 4.0) * (rho - 2.0) * rho_inf /
                            ((rho_inf - 4) * (rho_inf - 2) * rho)).sqrt() * c2.sqrt();
        Tensor m_hat = mi / c1.cast(mi.dtype());
        Tensor adaptive = m_hat * rectified.cast(mi.dtype()) / (vi.sqrt() + float(eps));
        Tensor step = where(rho > 5.0, adaptive, m_hat) * lr_of(i);
        out.insert(out.end(), {mi, vi, p.assign(p - step)});
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> RAdam::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < params.size(); i++)
        out.push_back({{"exp_avg", m[i]}, {"exp_avg_sq", v[i]}, {"skipped", skipped[i]}});
    return out;
}

Adadelta::Adadelta(std::vector<Tensor> ps, double learning_rate, double r, double e, double wd,
                   Loc loc)
    : Optimizer(std::move(ps), learning_rate, loc), rho(r), eps(e), weight_decay(wd) {
    detail::UserLocScope at(loc);
    if (!(rho >= 0 && rho <= 1))
        detail::fail(strf("Adadelta: rho must be in [0, 1], got %g", rho));
    check_at_least_0("Adadelta", "eps", eps);
    check_at_least_0("Adadelta", "weight_decay", weight_decay);
    for (const Tensor& p : params) {
        square_avg.push_back(Tensor::zeros_like(p).realize());
        acc_delta.push_back(Tensor::zeros_like(p).realize());
    }
}
std::vector<Tensor> Adadelta::updates() {
    std::vector<Tensor> out;
    for (size_t i = 0; i < params.size(); i++) {
        Tensor p = params[i], g = p.grad();
        if (!g.defined()) continue;
        if (double wd = weight_decay_of(i, weight_decay); wd != 0) g = g + p * float(wd);
        Tensor s = square_avg[i].assign(square_avg[i] * float(rho) + g * g * float(1 - rho));
        Tensor d = (acc_delta[i] + float(eps)).sqrt() / (s + float(eps)).sqrt() * g;
        Tensor a = acc_delta[i].assign(acc_delta[i] * float(rho) + d * d * float(1 - rho));
        out.insert(out.end(), {s, a, p.assign(p - lr_of(i) * d)});
    }
    return out;
}
std::vector<std::vector<std::pair<std::string, Tensor>>> Adadelta::param_state() {
    std::vector<std::vector<std::pair<std::string, Tensor>>> out;
    for (size_t i = 0; i < params.size(); i++)
        out.push_back({{"square_avg", square_avg[i]}, {"acc_delta", acc_delta[i]}});
    return out;
}
}  // namespace optim

// ---- [PARALLEL] data parallelism: one training step over several devices ------ >>parallel
// Three programs are built on the first device and not run there: the shard's forward and
// backward (one per shard size), the merge (into += from for every parameter) and the
// optimizer's update, which reads its gradients as mine + theirs: the tree's last addition
// happens inside the update, so no pass over the gradients is spent on it. Each device
// prepares them once (a CPU device finds the compiled code in memory; CUDA loads the cached
// CUBIN) and keeps their buffers: its shard's rows, its copies of what the loss reads, its
// gradients. A device reads its partner's gradients where they lie when it can read that
// memory (CPU devices), else from its merge buffers, copied on the partner's queue. Tests:
// tests/test_parallel.cpp.
namespace detail {
// A program built once, with the realized tensors it reads or writes in place.
struct BuiltProgram {
    ProgramRun run;                                // prog and exe (first device), buffer ids
    std::vector<std::shared_ptr<Buffer>> given;    // per program buffer: null if none
    int slot(const NodeP& n) const {
        auto it = run.buffer_ids.find(n.get());
        if (it == run.buffer_ids.end()) fail("DataParallel: a program does not read its input");
        return it->second;
    }
};
static BuiltProgram build_only(const std::vector<NodeP>& targets, Device& dev) {
    BuiltProgram b;
    build_program(targets, dev, b.run);
    for (Node* owner : b.run.owners) b.given.push_back(owner->buffer);
    b.run.owners.clear();   // the graph goes; the buffers stay
    return b;
}
// A BUFFER node on dev, standing for data each run binds.
static NodeP placeholder(const Shape& shape, DType dt, Device& dev) {
    NodeP n = node_make(Op::BUFFER, dt, shape, {}, Loc{});
    n->buffer = std::make_shared<Buffer>(&dev, dt, shape_numel(shape));
    return n;
}
// A tensor copied to another device, and the in-place update of the original it holds.
struct Replica {
    std::shared_ptr<Buffer> source, copy;
    uint64_t copied_at = 0;
    bool copied = false;
    void refresh(Device& to) {
        uint64_t w = source->written_at;
        if (source->arena) w = std::max(w, source->arena->written_at);
        if (copied && w == copied_at) return;
        source->device->copy_to(to, copy->ptr, source->ptr, source->bytes());
        copied = true;
        copied_at = w;
    }
};
// One shard size's forward and backward: its loss and the gradients of loss·weight.
struct ShardProgram {
    BuiltProgram built;
    std::vector<int> shard_slots;   // per batch tensor
    int weight_slot = -1, loss_slot = -1;
    Shape loss_shape;
    std::vector<int> grad_slots;    // per parameter
};
// The update's program: the gradients are mine (+ theirs when two devices' are summed here).
struct UpdateProgram {
    BuiltProgram built;
    std::vector<int> mine, theirs;  // per parameter
};
// A shard program on one device: its code and buffers, and those of its merge and update
// (unbound: null, set per step: the partner's gradients).
struct ShardOnDevice {
    std::shared_ptr<Executable> exe;
    std::vector<std::shared_ptr<Buffer>> buffers, merge_buffers, update_buffers[2];
    std::vector<void*> ptrs, merge_ptrs, update_ptrs[2];
    std::vector<Replica*> replicas;
    int64_t err[2] = {0, 0}, merge_err[2] = {0, 0};
    const std::shared_ptr<Buffer>& grad(const ShardProgram& sp, size_t j) const {
        return buffers[size_t(sp.grad_slots[j])];
    }
};
static std::vector<void*> pointers(const std::vector<std::shared_ptr<Buffer>>& buffers) {
    std::vector<void*> out;
    for (auto& b : buffers) out.push_back(b ? b->ptr : nullptr);
    return out;
}
}  // namespace detail

struct DataParallel::State {
    std::vector<Device*> devs;
    optim::Optimizer* opt = nullptr;
    Loss loss;
    AllReduce sum_over_processes;
    int processes = 1;
    std::map<int64_t, ShardProgram> shards;                             // by rows
    std::map<std::pair<const ShardProgram*, size_t>, ShardOnDevice> on_device;
    std::vector<std::map<const Buffer*, Replica>> replicas;             // per device
    std::vector<std::vector<std::shared_ptr<Buffer>>> received;         // per device, parameter
    std::optional<BuiltProgram> merge;
    std::vector<int> merge_into, merge_from;                            // per parameter
    std::vector<std::shared_ptr<Executable>> merge_exe;                 // per device
    std::optional<UpdateProgram> update[2];                             // [1]: mine + theirs
    Times times;
    std::vector<std::chrono::steady_clock::time_point> computed_at;     // per device
};

// Checked at each step too: a layer may have moved since (Module::to).
static void check_parameters_on_first_device(const DataParallel::State& st) {
    const std::vector<Tensor>& params = st.opt->params;
    for (size_t i = 0; i < params.size(); i++) {
        Device* d = node_device(params[i].node().get());
        if (d && d != st.devs[0])
            fail(strf("DataParallel: parameter %zu (%s) is on %s; the parameters live on the "
                      "first device, %s", i, shape_str(params[i].shape()).c_str(), d->name(),
                      st.devs[0]->name()));
    }
}
DataParallel::DataParallel(std::vector<std::string> devices, optim::Optimizer& optimizer,
                           Loss loss, Loc loc)
    : state_(std::make_shared<State>()) {
    UserLocScope at(loc);
    State& st = *state_;
    if (devices.empty()) fail("DataParallel: no devices");
    for (const std::string& name : devices) {
        Device* d = &device(name);
        if (std::count(st.devs.begin(), st.devs.end(), d))
            fail(strf("DataParallel: device %s is named twice (as %s)", d->name(), name.c_str()));
        for (auto& [pass, run] : PASSES)   // the programs are optimized for the first device
            if (!st.devs.empty() && d->runs_pass(pass) != st.devs[0]->runs_pass(pass))
                fail(strf("DataParallel: %s and %s are devices of different kinds; use devices "
                          "of one kind (CPU:0, CPU:1, ... or CUDA:0, CUDA:1, ...)",
                          st.devs[0]->name(), d->name()));
        st.devs.push_back(d);
    }
    st.opt = &optimizer;
    check_parameters_on_first_device(st);
    st.loss = std::move(loss);
    size_t n = st.devs.size();
    st.replicas.resize(n);
    st.received.resize(n);
    st.merge_exe.resize(n);
    st.times.device_ms.resize(n);
    st.computed_at.resize(n);
}

std::vector<int64_t> DataParallel::split(int64_t rows, int devices, Loc loc) {
    UserLocScope at(loc);
    if (devices < 1) fail("DataParallel::split: need at least one device");
    if (rows < devices)
        fail(strf("DataParallel: a batch of %lld rows cannot be split over %d devices (every "
                  "device needs a row)", (long long)rows, devices));
    std::vector<int64_t> out(size_t(devices), rows / devices);
    for (int64_t k = 0; k < rows % devices; k++) out[size_t(k)]++;
    return out;
}

void DataParallel::all_reduce(AllReduce sum_over_processes, int processes) {
    if (processes < 1) fail(strf("DataParallel::all_reduce: %d processes", processes));
    state_->sum_over_processes = std::move(sum_over_processes);
    state_->processes = processes;
}
DataParallel::Times DataParallel::last_times() const { return state_->times; }
std::vector<std::string> DataParallel::devices() const {
    std::vector<std::string> out;
    for (Device* d : state_->devs) out.push_back(d->name());
    return out;
}

namespace detail {
static ShardProgram build_shard(DataParallel::State& st, const std::vector<Tensor>& batch,
                                int64_t rows) {
    Device& first = *st.devs[0];
    std::vector<NodeP> shard_nodes;
    std::vector<Tensor> shard;
    for (const Tensor& b : batch) {
        Shape s = b.shape();
        s[0] = rows;
        shard_nodes.push_back(placeholder(s, b.dtype(), first));
        shard.push_back(wrap(shard_nodes.back()));
    }
    Tensor loss;
    std::vector<NodeP> grads_before;   // a loss that calls backward() leaves them as they were
    for (const Tensor& p : st.opt->params) grads_before.push_back(p.node()->grad);
    auto restore_grads = [&] {
        for (size_t i = 0; i < grads_before.size(); i++)
            st.opt->params[i].node()->grad = grads_before[i];
    };
    std::vector<NodeP> targets;
    try {
        targets = capture_realizes([&] { loss = st.loss(shard); });
    } catch (...) {
        restore_grads();
        throw;
    }
    restore_grads();
    if (!loss.defined()) fail("DataParallel: the loss function returned an undefined tensor");
    if (loss.numel() != 1 || !dtype_is_float(loss.dtype()) || !loss.tracks_grad())
        fail(strf("DataParallel: the loss must be a float scalar that depends on the "
                  "parameters, got %s %s%s", dtype_name(loss.dtype()),
                  shape_str(loss.shape()).c_str(), loss.tracks_grad() ? "" : " without gradient"));
    NodeP weight = placeholder(loss.shape(), loss.dtype(), first);
    Gradients grads;
    {
        NoGrad no_grad;
        grads = backpropagate(loss, wrap(weight));
    }
    targets.push_back(loss.node());
    std::vector<NodeP> grad_nodes;
    for (size_t i = 0; i < st.opt->params.size(); i++) {
        const Tensor& p = st.opt->params[i];
        Tensor* g = grads.find(p.node().get());
        if (!g)
            fail(strf("DataParallel: parameter %zu (%s %s, made at %s) gets no gradient from "
                      "the loss; give the optimizer only the parameters the loss uses", i,
                      dtype_name(p.dtype()), shape_str(p.shape()).c_str(),
                      loc_str(p.node()->loc).c_str()));
        grad_nodes.push_back(g->node());
        targets.push_back(grad_nodes.back());
    }
    ShardProgram sp;
    sp.built = build_only(targets, first);
    const Program& prog = *sp.built.run.prog;
    if (!prog.updates.empty())
        fail("DataParallel: the loss writes a tensor in place (at " +
             loc_str(prog.updates[0].second) + "); the optimizer's step runs once after the "
             "gradients are merged, so the loss must not call it (nor use a layer that counts "
             "its calls in a tensor, such as nn::Dropout in training)");
    for (const NodeP& n : shard_nodes) {
        auto it = sp.built.run.buffer_ids.find(n.get());
        sp.shard_slots.push_back(it == sp.built.run.buffer_ids.end() ? -1 : it->second);
    }
    sp.weight_slot = sp.built.slot(weight);
    sp.loss_slot = sp.built.slot(loss.node());
    sp.loss_shape = loss.shape();
    for (const NodeP& g : grad_nodes) {
        sp.grad_slots.push_back(sp.built.slot(g));
        if (prog.buffers[size_t(sp.grad_slots.back())].role != ProgramBuffer::OUTPUT)
            fail("DataParallel: a gradient is not computed by the program (a parameter the "
                 "loss returns unchanged?)");
    }
    for (int slot : sp.shard_slots)
        if (slot >= 0) sp.built.given[size_t(slot)] = nullptr;   // each device's own
    sp.built.given[size_t(sp.weight_slot)] = nullptr;
    return sp;
}

static void build_merge(DataParallel::State& st) {
    std::vector<NodeP> into, from, targets;
    for (const Tensor& p : st.opt->params) {
        into.push_back(placeholder(p.shape(), p.dtype(), *st.devs[0]));
        from.push_back(placeholder(p.shape(), p.dtype(), *st.devs[0]));
        targets.push_back(wrap(into.back()).assign(wrap(into.back()) + wrap(from.back())).node());
    }
    st.merge = build_only(targets, *st.devs[0]);
    for (size_t j = 0; j < into.size(); j++) {
        st.merge_into.push_back(st.merge->slot(into[j]));
        st.merge_from.push_back(st.merge->slot(from[j]));
        st.merge->given[size_t(st.merge_from.back())] = nullptr;
        st.merge->given[size_t(st.merge_into.back())] = nullptr;
    }
}

// The optimizer's step with mine (+ theirs) as each parameter's grad().
static void build_update(DataParallel::State& st, bool two) {
    UpdateProgram up;
    std::vector<NodeP> mine, theirs, saved;
    for (Tensor& p : st.opt->params) {
        mine.push_back(placeholder(p.shape(), p.dtype(), *st.devs[0]));
        if (two) theirs.push_back(placeholder(p.shape(), p.dtype(), *st.devs[0]));
        saved.push_back(p.node()->grad);
        p.node()->grad =
            two ? add(wrap(mine.back()), wrap(theirs.back()), Loc{}).node() : mine.back();
    }
    std::vector<NodeP> targets;
    try {
        targets = capture_realizes([&] { st.opt->step(); });
    } catch (...) {
        for (size_t j = 0; j < saved.size(); j++) st.opt->params[j].node()->grad = saved[j];
        throw;
    }
    for (size_t j = 0; j < saved.size(); j++) st.opt->params[j].node()->grad = saved[j];
    up.built = build_only(targets, *st.devs[0]);
    for (const NodeP& g : mine) up.mine.push_back(up.built.slot(g));
    for (const NodeP& g : theirs) up.theirs.push_back(up.built.slot(g));
    for (int slot : up.mine) up.built.given[size_t(slot)] = nullptr;
    for (int slot : up.theirs) up.built.given[size_t(slot)] = nullptr;
    st.update[two] = std::move(up);
}

// Shard program sp on device k: prepared there (nothing compiles), with its buffers.
static ShardOnDevice& shard_on(DataParallel::State& st, const ShardProgram& sp, size_t k) {
    auto key = std::make_pair(&sp, k);
    auto found = st.on_device.find(key);
    if (found != st.on_device.end()) return found->second;
    Device& dev = *st.devs[k];
    ShardOnDevice& sd = st.on_device[key];
    const Program& prog = *sp.built.run.prog;
    sd.exe = k == 0 ? sp.built.run.exe : dev.prepare(prog);
    sd.buffers = allocate_buffers(prog, dev, [&](size_t i) -> std::shared_ptr<Buffer> {
        const std::shared_ptr<Buffer>& source = sp.built.given[i];
        if (!source || k == 0 || (dev.host_memory() && source->device->host_memory()))
            return source;   // read where it lies: nothing writes it while the devices run
        Replica& r = st.replicas[k][source.get()];
        if (!r.copy) {
            r.source = source;
            r.copy = std::make_shared<Buffer>(&dev, source->dtype, source->numel);
        }
        if (std::find(sd.replicas.begin(), sd.replicas.end(), &r) == sd.replicas.end())
            sd.replicas.push_back(&r);
        return r.copy;
    });
    sd.ptrs = pointers(sd.buffers);
    // its gradients as the merge's and the update's: mine, bound here; theirs: per step
    auto mine_in = [&](const std::vector<int>& slots, size_t i) {
        auto at = std::find(slots.begin(), slots.end(), int(i));
        return at == slots.end() ? nullptr : sd.grad(sp, size_t(at - slots.begin()));
    };
    if (st.merge) {
        if (!st.merge_exe[k])
            st.merge_exe[k] = k == 0 ? st.merge->run.exe : dev.prepare(*st.merge->run.prog);
        sd.merge_buffers = allocate_buffers(*st.merge->run.prog, dev, [&](size_t i) {
            return mine_in(st.merge_into, i);
        }, st.merge_from);
        sd.merge_ptrs = pointers(sd.merge_buffers);
    }
    for (int two = 0; k == 0 && two < 2; two++) {
        if (!st.update[two]) continue;
        const UpdateProgram& up = *st.update[two];
        sd.update_buffers[two] = allocate_buffers(*up.built.run.prog, dev, [&](size_t i) {
            std::shared_ptr<Buffer> g = mine_in(up.mine, i);
            return g ? g : up.built.given[i];
        }, up.theirs);
        sd.update_ptrs[two] = pointers(sd.update_buffers[two]);
    }
    return sd;
}

// Device b's gradients for device a to read: where they lie when a can read b's memory, else
// in a's merge buffers, copied on b's queue (while a still computes) once a's work up to event
// `free` (its last merge this step, which read them; 0: none) is done. The reader waits for
// b's queue to pass the event this leaves.
static std::vector<void*> send_gradients(DataParallel::State& st, size_t a, size_t b,
                                         ShardOnDevice& sb, const ShardProgram& pb,
                                         uint64_t free) {
    Device &into = *st.devs[a], &from = *st.devs[b];
    std::vector<void*> out;
    if (into.host_memory() && from.host_memory()) {
        for (size_t j = 0; j < pb.grad_slots.size(); j++) out.push_back(sb.grad(pb, j)->ptr);
        return out;
    }
    if (st.received[a].empty())
        for (const Tensor& p : st.opt->params)
            st.received[a].push_back(std::make_shared<Buffer>(&into, p.dtype(), p.numel()));
    from.queue().enqueue([&st, &into, &from, &sb, &pb, free, a] {
        if (free) into.queue().wait(free);
        for (size_t j = 0; j < pb.grad_slots.size(); j++) {
            const Buffer& g = *sb.grad(pb, j);
            from.copy_to(into, st.received[a][j]->ptr, g.ptr, g.bytes());
        }
    });
    for (auto& r : st.received[a]) out.push_back(r->ptr);
    return out;
}

static std::vector<void*> with_theirs(std::vector<void*> ptrs, const std::vector<int>& slots,
                                      const std::vector<void*>& theirs) {
    for (size_t j = 0; j < slots.size(); j++) ptrs[size_t(slots[j])] = theirs[j];
    return ptrs;
}

// Waits for every queue; the first error (in device order) is thrown once all are idle.
static void wait_all(const std::vector<Device*>& devs) {
    wait_each(devs, [](Device& d) { d.queue().synchronize(); });
}

static double read_scalar(const Buffer& b) {
    if (b.dtype == DType::FLOAT64) {
        double v = 0;
        b.device->copy_out(&v, b.ptr, sizeof v);
        return v;
    }
    float f = 0;
    b.device->copy_out(&f, b.ptr, sizeof f);
    return f;
}
static void write_scalar(Device& dev, const Buffer& b, double v) {
    float f = float(v);
    if (b.dtype == DType::FLOAT64) dev.copy_in(b.ptr, &v, sizeof v);
    else dev.copy_in(b.ptr, &f, sizeof f);
}
static double ms_between(std::chrono::steady_clock::time_point a,
                         std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace detail

Tensor DataParallel::operator()(const std::vector<Tensor>& batch_in, Loc loc) {
    using clock = std::chrono::steady_clock;
    State& st = *state_;
    auto t_step = clock::now();
    size_t N = st.devs.size();
    finish_all_in_flight();
    // 1. the batch checked (naming the caller's line: the programs built below do not, so
    // that their code is the same from any line), realized, its rows split
    std::vector<Tensor> batch;
    std::vector<int64_t> sizes;
    {
        UserLocScope at(loc);
        if (jit_capture)
            fail("DataParallel: a step cannot run inside a jitted function (it compiles its own "
                 "programs once; call it directly)");
        if (batch_in.empty()) fail("DataParallel: the batch has no tensors");
        for (size_t i = 0; i < batch_in.size(); i++) {
            const Tensor& b = batch_in[i];
            if (b.ndim() == 0)
                fail(strf("DataParallel: batch tensor %zu is a scalar; each is split along its "
                          "first axis", i));
            if (b.shape()[0] != batch_in[0].shape()[0])
                fail(strf("DataParallel: batch tensors 0 and %zu have %s and %s rows: each is "
                          "split along its first axis", i,
                          shape_str(batch_in[0].shape()).c_str(), shape_str(b.shape()).c_str()));
            batch.push_back(b.node()->op == Op::BUFFER ? b : b.contiguous());
        }
        sizes = split(batch_in[0].shape()[0], int(N));
        check_parameters_on_first_device(st);
    }
    realize_pending_leaves(RunMode::NOW);   // the devices' copies are made from them below
    for (Tensor& b : batch)
        if (!b.realized()) realize_nodes({b.node()}, true);
    int64_t rows = batch[0].shape()[0];
    // 2. the programs (the first step of a shard size builds them) and each device's buffers.
    // The tree adds k + stride into k for strides 1, 2, 4, ... below `last`; the update adds
    // device `last` into 0 (or, with processes to sum over, the merge does it first).
    size_t last = 0;
    while ((last ? 2 * last : 1) < N) last = last ? 2 * last : 1;
    bool fused = last > 0 && !st.sum_over_processes;
    size_t merge_below = fused ? last : N;
    std::vector<const ShardProgram*> programs(N);
    for (size_t k = 0; k < N; k++) {
        auto it = st.shards.find(sizes[k]);
        if (it == st.shards.end())
            it = st.shards.emplace(sizes[k], build_shard(st, batch, sizes[k])).first;
        programs[k] = &it->second;
    }
    if ((merge_below > 1 && !st.merge) || !st.update[fused]) {
        if (merge_below > 1 && !st.merge) build_merge(st);
        if (!st.update[fused]) build_update(st, fused);
        st.on_device.clear();   // bound before these programs existed
    }
    std::vector<ShardOnDevice*> on(N);
    for (size_t k = 0; k < N; k++) on[k] = &shard_on(st, *programs[k], k);
    // 3. forward and backward on every device at once
    int threads_each = std::max(1, thread_count() / int(N));
    int64_t first_row = 0;
    for (size_t k = 0; k < N; k++) {
        Device& dev = *st.devs[k];
        ShardOnDevice& sd = *on[k];
        const ShardProgram& sp = *programs[k];
        struct Rows { std::shared_ptr<Buffer> from; size_t offset, bytes; void* to; };
        std::vector<Rows> copies;
        for (size_t i = 0; i < batch.size(); i++) {
            int slot = sp.shard_slots[i];
            if (slot < 0) continue;
            const std::shared_ptr<Buffer>& from = batch[i].node()->buffer;
            size_t row_bytes = from->bytes() / size_t(rows);
            copies.push_back({from, size_t(first_row) * row_bytes, size_t(sizes[k]) * row_bytes,
                              sd.buffers[size_t(slot)]->ptr});
        }
        double weight = double(sizes[k]) / double(rows) / st.processes;
        dev.queue().enqueue([&st, &dev, &sd, &sp, copies, weight, threads_each, k] {
            auto t0 = clock::now();
            ThreadsHere threads(threads_each);
            for (const Rows& c : copies)
                c.from->device->copy_to(dev, c.to, static_cast<char*>(c.from->ptr) + c.offset,
                                        c.bytes);
            for (Replica* r : sd.replicas) r->refresh(dev);
            write_scalar(dev, *sd.buffers[size_t(sp.weight_slot)], weight);
            sd.err[0] = sd.err[1] = 0;
            sd.exe->run(sd.ptrs.data(), sd.err);
            st.computed_at[k] = clock::now();
            st.times.device_ms[k] = ms_between(t0, st.computed_at[k]);
        });
        first_row += sizes[k];
    }
    // 4. the merge, each pair as soon as its two devices are done; the merges of a stride
    // share the threads
    std::vector<uint64_t> merged(N, 0);   // per device: the event after its last merge
    for (size_t stride = 1; stride < merge_below; stride *= 2) {
        int pairs = int((N - stride + 2 * stride - 1) / (2 * stride));
        int threads_merging = std::max(1, thread_count() / pairs);
        for (size_t a = 0; a + stride < N; a += 2 * stride) {
            size_t b = a + stride;
            ShardOnDevice& sa = *on[a];
            std::vector<void*> ptrs = with_theirs(
                sa.merge_ptrs, st.merge_from,
                send_gradients(st, a, b, *on[b], *programs[b], merged[a]));
            Device& from = *st.devs[b];
            uint64_t ready = from.queue().record();
            merged[a] = st.devs[a]->queue().enqueue(
                [&st, &from, &sa, ptrs, ready, threads_merging, a] {
                    from.queue().wait(ready);
                    ThreadsHere threads(threads_merging);
                    sa.merge_err[0] = sa.merge_err[1] = 0;
                    st.merge_exe[a]->run(ptrs.data(), sa.merge_err);
                });
        }
    }
    std::vector<void*> update_ptrs = on[0]->update_ptrs[fused];
    if (fused)
        update_ptrs = with_theirs(update_ptrs, st.update[1]->theirs,
                                  send_gradients(st, 0, last, *on[last], *programs[last],
                                                 merged[0]));
    wait_all(st.devs);
    for (size_t k = 0; k < N; k++) {   // a failed check: the step ends, nothing was updated
        try {
            check_errors(*programs[k]->built.run.prog, on[k]->err);
        } catch (const Error& e) {
            throw Error(strf("%s (on %s, shard of %lld rows)", e.what(), st.devs[k]->name(),
                             (long long)sizes[k]));
        }
    }
    for (size_t stride = 1; stride < merge_below; stride *= 2)
        for (size_t a = 0; a + stride < N; a += 2 * stride)
            check_errors(*st.merge->run.prog, on[a]->merge_err);
    // 5. across processes, then the update on the first device
    if (st.sum_over_processes) {
        std::vector<Tensor> grads;
        for (size_t j = 0; j < st.opt->params.size(); j++) {
            const std::shared_ptr<Buffer>& g = on[0]->grad(*programs[0], j);
            NodeP n = node_make(Op::BUFFER, g->dtype, st.opt->params[j].shape(), {}, Loc{});
            n->buffer = g;
            grads.push_back(wrap(n));
        }
        st.sum_over_processes(grads);
    }
    auto t_update = clock::now();
    st.times.merge_ms = ms_between(
        *std::max_element(st.computed_at.begin(), st.computed_at.end()), t_update);
    const UpdateProgram& up = *st.update[fused];
    int64_t err[2] = {0, 0};
    up.built.run.exe->run(update_ptrs.data(), err);
    note_updates(*up.built.run.prog, on[0]->update_buffers[fused]);
    check_errors(*up.built.run.prog, err);
    st.times.update_ms = ms_between(t_update, clock::now());
    // 6. the batch's loss: the shards' losses by their share of the rows
    double loss = 0;
    for (size_t k = 0; k < N; k++)
        loss += double(sizes[k]) / double(rows) *
                read_scalar(*on[k]->buffers[size_t(programs[k]->loss_slot)]);
    const Buffer& loss0 = *on[0]->buffers[size_t(programs[0]->loss_slot)];
    NodeP out = node_make(Op::BUFFER, loss0.dtype, programs[0]->loss_shape, {}, Loc{});
    out->buffer = std::make_shared<Buffer>(st.devs[0], loss0.dtype, 1);
    write_scalar(*st.devs[0], *out->buffer, loss);
    st.times.step_ms = ms_between(t_step, clock::now());
    if (debug_level() >= 1)
        std::fprintf(stderr, "[tg] data-parallel step on %zu devices: slowest %.3f ms, merge "
                     "%.3f ms, update %.3f ms, step %.3f ms\n", N,
                     *std::max_element(st.times.device_ms.begin(), st.times.device_ms.end()),
                     st.times.merge_ms, st.times.update_ms, st.times.step_ms);
    return wrap(out);
}

// ---- [DATA] toy datasets and batches ----------------------------------------------------- >>data
namespace data {
// sklearn's make_moons: the upper half circle (label -1) and a lower one shifted right and down
// (label +1), n/2 points each, plus Gaussian noise from Tensor::randn
Dataset moons(int64_t n, double noise, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    if (n < 2) detail::fail(strf("moons: need at least 2 points, got %lld", (long long)n));
    int64_t n_out = n / 2, n_in = n - n_out;
    std::vector<float> xy, labels;
    for (int64_t i = 0; i < n_out; i++) {
        double t = detail::PI * double(i) / double(std::max<int64_t>(n_out - 1, 1));
        xy.insert(xy.end(), {float(std::cos(t)), float(std::sin(t))});
        labels.push_back(-1);
    }
    for (int64_t i = 0; i < n_in; i++) {
        double t = detail::PI * double(i) / double(std::max<int64_t>(n_in - 1, 1));
        xy.insert(xy.end(), {float(1 - std::cos(t)), float(1 - std::sin(t) - 0.5)});
        labels.push_back(1);
    }
    Tensor X = Tensor::from_vector(xy, {n, 2}) + Tensor::randn({n, 2}, seed) * float(noise);
    return {X.realize(), Tensor::from_vector(labels, {n})};
}

std::vector<Tensor> batches(int64_t n, int64_t batch_size, uint64_t seed, Loc loc) {
    detail::UserLocScope at(loc);
    if (batch_size <= 0 || n < 0)
        detail::fail(strf("batches: need n >= 0 and batch_size > 0, got n %lld, batch_size %lld",
                          (long long)n, (long long)batch_size));
    std::vector<int32_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) order[size_t(i)] = int32_t(i);
    uint64_t state = seed;
    for (size_t i = order.size(); i > 1; i--) {   // Fisher-Yates with splitmix64
        state = detail::mix_seed(state, i);
        std::swap(order[i - 1], order[size_t(state % i)]);
    }
    std::vector<Tensor> out;
    for (int64_t b = 0; b + batch_size <= n; b += batch_size)
        out.push_back(Tensor::from_vector(
            std::vector<int32_t>(order.begin() + b, order.begin() + b + batch_size)));
    return out;
}
}  // namespace data

TG_COLD_BEGIN   // to the end: plots and safetensors files, once each
// ---- [PLOT] terminal and SVG plots ------------------------------------------------------- >>plot
namespace plot {
namespace {
struct Grid {   // the scorer's sign over a width×height grid covering the points, with a margin
    double x0, x1, y0, y1;
    std::vector<float> xs, ys, labels, scores;
};
Grid grid_scores(const Scorer& score, const Tensor& X, const Tensor& Y, int w, int h) {
    Grid g;
    std::vector<float> pts = X.to_vector();
    g.labels = Y.to_vector();
    if (X.ndim() != 2 || X.size(1) != 2 || int64_t(g.labels.size()) != X.size(0))
        detail::fail(strf("plot: points must be [N,2] with N labels, got %s and %s",
                          shape_str(X.shape()).c_str(), shape_str(Y.shape()).c_str()));
    g.x0 = g.y0 = INFINITY;
    g.x1 = g.y1 = -INFINITY;
    for (size_t i = 0; i < pts.size(); i += 2) {
        g.xs.push_back(pts[i]);
        g.ys.push_back(pts[i + 1]);
        g.x0 = std::min(g.x0, double(pts[i])), g.x1 = std::max(g.x1, double(pts[i]));
        g.y0 = std::min(g.y0, double(pts[i + 1])), g.y1 = std::max(g.y1, double(pts[i + 1]));
    }
    double mx = 0.05 * (g.x1 - g.x0) + 1e-6, my = 0.05 * (g.y1 - g.y0) + 1e-6;
    g.x0 -= mx, g.x1 += mx, g.y0 -= my, g.y1 += my;
    std::vector<float> grid;
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++)
            grid.insert(grid.end(), {float(g.x0 + (c + 0.5) * (g.x1 - g.x0) / w),
                                     float(g.y1 - (r + 0.5) * (g.y1 - g.y0) / h)});
    NoGrad no_grad;
    g.scores = score(Tensor::from_vector(grid, {int64_t(w) * h, 2})).reshape({-1}).to_vector();
    return g;
}
}  // namespace

std::string decision_boundary(const Scorer& score, const Tensor& X, const Tensor& Y, int w, int h,
                              Loc loc) {
    detail::UserLocScope at(loc);
    Grid g = grid_scores(score, X, Y, w, h);
    std::vector<std::string> rows(size_t(h), std::string(size_t(w), ' '));
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++)
            rows[size_t(r)][size_t(c)] = g.scores[size_t(r * w + c)] > 0 ? '*' : '.';
    for (size_t i = 0; i < g.xs.size(); i++) {
        int c = int((g.xs[i] - g.x0) / (g.x1 - g.x0) * w),
            r = int((g.y1 - g.ys[i]) / (g.y1 - g.y0) * h);
        if (c >= 0 && c < w && r >= 0 && r < h)
            rows[size_t(r)][size_t(c)] = g.labels[i] > 0 ? '#' : '+';
    }
    std::string out;
    for (auto& row : rows) out += row + "\n";
    return out;
}

void decision_boundary_svg(const std::string& path, const Scorer& score, const Tensor& X,
                           const Tensor& Y, int w, int h, Loc loc) {
    detail::UserLocScope at(loc);
    const int cell = 6;
    Grid g = grid_scores(score, X, Y, w / cell, h / cell);
    std::string svg =
        strf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n", w, h);
    for (int r = 0; r < h / cell; r++)
        for (int c = 0; c < w / cell; c++)
            svg += strf("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>\n",
                        c * cell, r * cell, cell, cell,
                        g.scores[size_t(r * (w / cell) + c)] > 0 ? "#fde2c4" : "#cfe3f7");
    for (size_t i = 0; i < g.xs.size(); i++)
        svg += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    (g.xs[i] - g.x0) / (g.x1 - g.x0) * w, (g.y1 - g.ys[i]) / (g.y1 - g.y0) * h,
                    g.labels[i] > 0 ? "#d9480f" : "#1864ab");
    detail::write_file_atomic(path, svg + "</svg>\n");
}

std::string line_chart(const std::vector<double>& values, int w, int h) {
    if (values.empty() || w < 2 || h < 2) return "";
    double lo = *std::min_element(values.begin(), values.end()),
           hi = *std::max_element(values.begin(), values.end());
    if (hi == lo) hi = lo + 1;
    std::vector<std::string> rows(size_t(h), std::string(size_t(w), ' '));
    for (int c = 0; c < w; c++) {
        size_t i =
            values.size() == 1 ? 0 : size_t(double(c) / (w - 1) * double(values.size() - 1) + 0.5);
        int r = int((hi - values[i]) / (hi - lo) * (h - 1) + 0.5);
        rows[size_t(r)][size_t(c)] = '*';
    }
    std::string out;
    for (int r = 0; r < h; r++)
        out += strf("%10.4f |", hi - (hi - lo) * r / (h - 1)) + rows[size_t(r)] + "\n";
    return out + std::string(11, ' ') + "+" + std::string(size_t(w), '-') + "\n";
}
}  // namespace plot

// ---- [SAFETENSORS] save and load named tensors ------------------------------------ >>safetensors
// The file is checked completely before any tensor is made: a truncated or malformed file
// throws and returns nothing. Saving writes a temporary file and renames it. Tensors are
// stored in this machine's byte order, which the format requires to be little-endian.
// Tests: tests/test_training.cpp.
namespace safetensors {
namespace {
void check_little_endian(const std::string& path) {
    uint16_t probe = 1;
    unsigned char first;
    std::memcpy(&first, &probe, 1);
    if (first != 1) detail::fail("safetensors: " + path + ": needs a little-endian machine");
}

const char* code_of(DType dt) {
    switch (dt) {
    case DType::FLOAT32: return "F32";
    case DType::FLOAT64: return "F64";
    case DType::INT32: return "I32";
    case DType::INT64: return "I64";
    case DType::BOOL: return "BOOL";
    default: return nullptr;
    }
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += std::string("\\") + c;
        else if ((unsigned char)c < 0x20) out += strf("\\u%04x", c);
        else out += c;
    }
    return out + "\"";
}

// The subset of JSON a safetensors header uses: objects, arrays, strings, integers.
struct Json {
    enum Kind { OBJECT, ARRAY, STRING, NUMBER } kind = NUMBER;
    std::vector<std::string> keys;   // OBJECT: keys[i] names items[i]
    std::vector<Json> items;         // OBJECT members, ARRAY elements
    std::string text;
    double number = 0;
    const Json* get(const std::string& key) const {
        for (size_t i = 0; i < keys.size(); i++)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }
};

struct JsonParser {
    const std::string& s;
    size_t i = 0;
    std::string where;
    [[noreturn]] void bad(const std::string& why) {
        detail::fail(strf("safetensors: %s: malformed header: %s at byte %zu", where.c_str(),
                          why.c_str(), i));
    }
    void space() { while (i < s.size() && std::isspace((unsigned char)s[i])) i++; }
    void expect(char c) {
        space();
        if (i >= s.size() || s[i] != c) bad(strf("expected '%c'", c));
        i++;
    }
    std::string string_value() {
        expect('"');
        std::string out;
        while (true) {
            if (i >= s.size()) bad("unterminated string");
            char c = s[i++];
            if (c == '"') return out;
            if (c != '\\') { out += c; continue; }
            if (i >= s.size()) bad("unterminated escape");
            char e = s[i++];
            if (e == 'u') {   // UTF-16 code units; a surrogate pair makes one code point
                unsigned code = hex4();
                if (code >= 0xDC00 && code < 0xE000) bad("lone low surrogate");
                if (code >= 0xD800 && code < 0xDC00) {
                    if (s.compare(i, 2, "\\u") != 0) bad("lone high surrogate");
                    i += 2;
                    unsigned low = hex4();
                    if (low < 0xDC00 || low >= 0xE000) bad("lone high surrogate");
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                }
                utf8(code, out);
            } else {
                const char* from = "\"\\/bfnrt";
                const char* to = "\"\\/\b\f\n\r\t";
                const char* at = std::strchr(from, e);
                if (!at || !e) bad("bad escape");
                out += to[at - from];
            }
        }
    }
    Json value(int depth = 0) {
        if (depth > 16) bad("nested too deeply");
        space();
        if (i >= s.size()) bad("unexpected end");
        Json v;
        if (s[i] == '{') {
            v.kind = Json::OBJECT;
            i++;
            space();
            if (i < s.size() && s[i] == '}') { i++; return v; }
            while (true) {
                v.keys.push_back(string_value());
                if (std::count(v.keys.begin(), v.keys.end(), v.keys.back()) > 1)
                    bad("duplicate key '" + v.keys.back() + "'");
                expect(':');
                v.items.push_back(value(depth + 1));
                space();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                expect('}');
                return v;
            }
        }
        if (s[i] == '[') {
            v.kind = Json::ARRAY;
            i++;
            space();
            if (i < s.size() && s[i] == ']') { i++; return v; }
            while (true) {
                v.items.push_back(value(depth + 1));
                space();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                expect(']');
                return v;
            }
        }
        if (s[i] == '"') {
            v.kind = Json::STRING;
            v.text = string_value();
            return v;
        }
        // JSON's number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
        if (s[i] != '-' && !std::isdigit((unsigned char)s[i])) bad("unexpected character");
        size_t start = i;
        auto digits = [&] {
            size_t from = i;
            while (i < s.size() && std::isdigit((unsigned char)s[i])) i++;
            return i - from;
        };
        if (i < s.size() && s[i] == '-') i++;
        size_t lead = i, whole = digits();
        if (whole == 0 || (whole > 1 && s[lead] == '0')) bad("malformed number");
        if (i < s.size() && s[i] == '.' && (i++, digits() == 0)) bad("malformed number");
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            i++;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
            if (digits() == 0) bad("malformed number");
        }
        v.number = std::strtod(s.substr(start, i - start).c_str(), nullptr);
        return v;
    }
    unsigned hex4() {
        if (i + 4 > s.size()) bad("short \\u escape");
        unsigned code = 0;
        for (int k = 0; k < 4; k++) {
            char c = s[i++];
            if (!std::isxdigit((unsigned char)c)) bad("bad \\u escape");
            int digit = std::isdigit((unsigned char)c) ? c - '0' : std::tolower(c) - 'a' + 10;
            code = code * 16 + unsigned(digit);
        }
        return code;
    }
    static void utf8(unsigned code, std::string& out) {
        if (code < 0x80) { out += char(code); return; }
        if (code < 0x800) {
            out += {char(0xC0 | (code >> 6)), char(0x80 | (code & 0x3F))};
            return;
        }
        if (code < 0x10000) {
            out += {char(0xE0 | (code >> 12)), char(0x80 | ((code >> 6) & 0x3F)),
                    char(0x80 | (code & 0x3F))};
            return;
        }
        out += {char(0xF0 | (code >> 18)), char(0x80 | ((code >> 12) & 0x3F)),
                char(0x80 | ((code >> 6) & 0x3F)), char(0x80 | (code & 0x3F))};
    }
};

int64_t whole_number(const Json* v, JsonParser& p, const std::string& what) {
    if (!v || v->kind != Json::NUMBER || v->number < 0 || v->number != std::floor(v->number))
        p.bad(what + " must be a non-negative integer");
    if (v->number > 9e15)   // no file is that large, and a double is exact only below 2^53
        p.bad(strf("%s: %.0f is too large", what.c_str(), v->number));
    return int64_t(v->number);
}
}  // namespace

void save(const std::string& path, const std::map<std::string, Tensor>& tensors, Loc loc) {
    detail::UserLocScope at(loc);
    check_little_endian(path);
    std::string header = "{", body;
    for (auto& [name, t] : tensors) {
        const char* code = code_of(t.dtype());
        if (!code)
            detail::fail("safetensors: " + path + ": tensor '" + name +
                         "' has an unsupported dtype");
        std::vector<char> raw = detail::tensor_bytes(t);
        std::string bytes(raw.begin(), raw.end());
        std::string shape;
        for (int64_t d : t.shape()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        header += strf("%s%s:{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                       header.size() > 1 ? "," : "", json_string(name).c_str(), code, shape.c_str(),
                       body.size(), body.size() + bytes.size());
        body += bytes;
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');   // the data starts 8-byte aligned
    std::string file(8, '\0');
    uint64_t n = header.size();
    for (int b = 0; b < 8; b++) file[size_t(b)] = char((n >> (8 * b)) & 0xff);   // little-endian
    detail::write_file_atomic(path, file + header + body);
}

std::map<std::string, Tensor> load(const std::string& path, Loc loc) {
    detail::UserLocScope at(loc);
    std::string file;
    if (!detail::read_file(path, file))
        detail::fail("safetensors: cannot read " + path + ": " + std::strerror(errno));
    return load_bytes(file, path);
}

std::map<std::string, Tensor> load_bytes(const std::string& file, const std::string& path,
                                         Loc loc) {
    detail::UserLocScope at(loc);
    check_little_endian(path);
    if (file.size() < 8)
        detail::fail(strf("safetensors: %s: file of %zu bytes is too short for a header",
                          path.c_str(), file.size()));
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) n = (n << 8) | uint8_t(file[size_t(b)]);
    if (n > file.size() - 8)
        detail::fail(
            strf("safetensors: %s: header of %llu bytes runs past the end of the %zu-byte file",
                 path.c_str(), (unsigned long long)n, file.size()));
    std::string header = file.substr(8, size_t(n));
    JsonParser p{header, 0, path};
    Json root = p.value();
    p.space();
    if (p.i != header.size()) p.bad("trailing characters");
    if (root.kind != Json::OBJECT) p.bad("the header is not an object");
    size_t data_start = 8 + size_t(n), data_size = file.size() - data_start;
    struct Entry { std::string name; DType dtype; Shape shape; int64_t begin, end; };
    std::vector<Entry> entries;
    for (size_t m = 0; m < root.keys.size(); m++) {
        const std::string& name = root.keys[m];
        const Json& v = root.items[m];
        if (name == "__metadata__") continue;
        if (v.kind != Json::OBJECT) p.bad("entry '" + name + "' is not an object");
        const Json* dt = v.get("dtype");
        const Json* shape = v.get("shape");
        const Json* offsets = v.get("data_offsets");
        if (!dt || dt->kind != Json::STRING) p.bad("entry '" + name + "' has no dtype");
        Entry e{name, DType::FLOAT32, {}, 0, 0};
        if (dt->text == "F32") e.dtype = DType::FLOAT32;
        else if (dt->text == "F64") e.dtype = DType::FLOAT64;
        else if (dt->text == "I32") e.dtype = DType::INT32;
        else if (dt->text == "I64") e.dtype = DType::INT64;
        else if (dt->text == "BOOL") e.dtype = DType::BOOL;
        else p.bad("entry '" + name + "' has unsupported dtype " + dt->text);
        if (!shape || shape->kind != Json::ARRAY) p.bad("entry '" + name + "' has no shape");
        int64_t bytes = int64_t(dtype_size(e.dtype));   // the sizes' product must fit even
        bool empty = false;                              // when one of them is 0
        for (auto& d : shape->items) {
            e.shape.push_back(whole_number(&d, p, "a size in '" + name + "'"));
            empty = empty || e.shape.back() == 0;
            if (e.shape.back() != 0 && __builtin_mul_overflow(bytes, e.shape.back(), &bytes))
                p.bad(strf("entry '%s': shape %s is too large", name.c_str(),
                           shape_str(e.shape).c_str()));
        }
        if (empty) bytes = 0;
        if (!offsets || offsets->kind != Json::ARRAY || offsets->items.size() != 2)
            p.bad("entry '" + name + "' needs data_offsets [begin, end]");
        e.begin = whole_number(&offsets->items[0], p, "data_offsets");
        e.end = whole_number(&offsets->items[1], p, "data_offsets");
        if (e.end < e.begin || e.end - e.begin != bytes)
            p.bad(strf("entry '%s': data_offsets [%lld, %lld] do not hold %lld bytes of %s %s",
                       name.c_str(), (long long)e.begin, (long long)e.end, (long long)bytes,
                       dtype_name(e.dtype), shape_str(e.shape).c_str()));
        if (size_t(e.end) > data_size)
            detail::fail(
                strf("safetensors: %s: entry '%s' ends at byte %lld of a %zu-byte data section "
                     "(truncated file?)",
                     path.c_str(), name.c_str(), (long long)e.end, data_size));
        entries.push_back(e);
    }
    // the data section is covered exactly, without holes or overlaps
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (auto& e : entries) spans.push_back({e.begin, e.end});
    std::sort(spans.begin(), spans.end());
    int64_t covered = 0;
    for (auto& [b, e] : spans) {
        if (b != covered)
            p.bad(
                strf("data byte ranges overlap or leave a hole at byte %lld", (long long)covered));
        covered = e;
    }
    if (size_t(covered) != data_size)
        detail::fail(strf("safetensors: %s: %zu bytes of data but the header accounts for %lld",
                          path.c_str(), data_size, (long long)covered));
    std::map<std::string, Tensor> out;
    Device& dev = detail::default_device();
    for (auto& e : entries) {   // a bool is the byte 0 or 1: anything else is not a bool
        const char* bytes = file.data() + data_start + size_t(e.begin);
        for (int64_t i = 0; e.dtype == DType::BOOL && i < e.end - e.begin; i++)
            if (uint8_t(bytes[i]) > 1)
                detail::fail(strf("safetensors: %s: entry '%s': bool element %lld is the byte %d, "
                                  "not 0 or 1", path.c_str(), e.name.c_str(), (long long)i,
                                  int(uint8_t(bytes[i]))));
    }
    for (auto& e : entries) {
        auto buf = std::make_shared<detail::Buffer>(&dev, e.dtype, detail::shape_numel(e.shape));
        dev.copy_in(buf->ptr, file.data() + data_start + size_t(e.begin), buf->bytes());
        detail::NodeP node = detail::node_make(Op::BUFFER, e.dtype, e.shape, {}, {});
        node->buffer = buf;
        out[e.name] = Tensor(node);
    }
    return out;
}
}  // namespace safetensors

TG_COLD_END
}  // namespace tg
#undef TG_COLD_BEGIN
#undef TG_COLD_END

#endif  // TINYGRAD_IMPLEMENTATION

/* =============================================================================================
   Part D: license
   ---------------------------------------------------------------------------------------------
   MIT License

   Copyright (c) 2026 the tinygrad.hpp authors

   Permission is hereby granted, free of charge, to any person obtaining a copy of this software
   and associated documentation files (the "Software"), to deal in the Software without
   restriction, including without limitation the rights to use, copy, modify, merge, publish,
   distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
   Software is furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all copies or
   substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
   BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
   DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
   ============================================================================================= */
