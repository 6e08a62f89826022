// Random graphs for the compiler oracle (tests/test_oracle.cpp, tests/oracle_main.cpp).
//
// generate(seed) draws a small graph of Tensor API calls: leaves of random small shapes (float32
// with requires_grad, float64, int32, constants, arange, rand), elementwise ops with
// broadcasting, comparisons and where, reductions with keepdim over random axes, argmax, casts,
// every movement op, cat and stack, matmul (batched too), gather, index_select and embedding
// lookups, softmax, log_softmax and a layer norm, cumsum (rows past its blocks of 256 too),
// topk, argmin and the indices of max and min, var and std, clamp, masked_fill, repeat,
// attention, one_hot, dropout, log1p, expm1, floor, ceil and trunc; then often a scalar loss
// (each float output times fixed random weights, summed) and its gradients by backward(), by
// tg::gradients or to second order. A Graph is plain data: run() builds it into tensors as many
// times as needed (realizing turns nodes into buffers, so each device needs its own copy) and
// listing() prints the same calls as C++ that compiles against this header, so a failure can
// be pasted and rerun.
//
// The oracle: check() realizes a batch of graphs in one program on the CPU device with every
// pass, and again on INTERP with TG_PASSES=none (the interpreter over the unoptimized IR), and
// compares every output and gradient: integers and bools exactly, floats within a tolerance.
// check_threads() compares the optimized run on one thread and on several, bit for bit.
// check_jit() trains the graph's parameters for a few steps under tg::Jit and eagerly, bit for
// bit. minimize() shrinks a failing graph while it keeps failing.
//
// Values stay well conditioned: leaves lie in [-2, 2], log and sqrt read x*x + 0.5, reciprocals
// and divisors |x| + 0.5, and a node whose bound passes 8 is scaled by a power of two. Where
// a tiny rounding difference would flip a discrete result (a float cast to int, ==, argmax),
// the operand is "exact": its values are multiples of 2^-grid that every op on the way computed
// without rounding, so the devices agree bit for bit whatever order or contraction they use.
// Every random draw comes from splitmix64 (not <random>, whose distributions differ between
// standard libraries), so a seed means the same graph everywhere.
#pragma once
#include "../tinygrad.hpp"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace oracle {

using tg::DType;
using tg::Shape;
using tg::Tensor;
using Pairs = std::vector<std::pair<int64_t, int64_t>>;

// ---- random numbers -------------------------------------------------------------------------

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() {   // splitmix64
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    int64_t range(int64_t lo, int64_t hi) {   // inclusive; the modulo bias is irrelevant here
        return lo + int64_t(next() % uint64_t(hi - lo + 1));
    }
    double uniform(double lo, double hi) {
        return lo + (hi - lo) * double(next() >> 11) * (1.0 / 9007199254740992.0);
    }
    bool chance(double p) { return uniform(0, 1) < p; }

private:
    uint64_t state_;
};

inline uint64_t mix_seed(uint64_t a, uint64_t b) {
    Rng r(a ^ (b * 0xD1B54A32D192ED03ull));
    return r.next();
}

// The values of a data leaf: uniform in [lo, hi], or, with grid_bits >= 0, multiples of
// 2^-grid_bits there (integers for integer T). Used by the listings too, so it is public.
template <typename T>
std::vector<T> leaf_values(uint64_t seed, int64_t n, double lo, double hi, int grid_bits) {
    Rng rng(seed);
    std::vector<T> values(size_t(std::max<int64_t>(n, 0)));
    double step = std::is_integral_v<T> ? 1.0 : grid_bits >= 0 ? std::ldexp(1.0, -grid_bits) : 0;
    for (T& v : values) {
        if (step > 0) {
            int64_t a = int64_t(std::ceil(lo / step)), b = int64_t(std::floor(hi / step));
            v = a <= b ? T(double(rng.range(a, b)) * step) : T(lo);
        } else {
            v = T(rng.uniform(lo, hi));
        }
    }
    return values;
}

// The layer norm of the graphs: eps 0.5 keeps near-constant rows well conditioned.
inline Tensor layer_norm(const Tensor& x, int axis) {
    Tensor centered = x - x.mean(axis, true);
    return centered / ((centered * centered).mean(axis, true) + 0.5f).sqrt();
}

// ---- the graph as data ----------------------------------------------------------------------

enum class Kind : uint8_t {
    LEAF, UNARY, SCALAR, BINARY, COMPARE, WHERE, NOT, REDUCE, ARGMAX, CAST, RESHAPE, PERMUTE,
    TRANSPOSE, EXPAND, PAD, SHRINK, SLICE, FLIP, SQUEEZE, UNSQUEEZE, FLATTEN, CONTIGUOUS, CAT,
    STACK, MATMUL, GATHER, INDEX_SELECT, EMBED, SOFTMAX, LOG_SOFTMAX, LAYER_NORM, CUMSUM, TOPK,
    INDEX_OF, VAR, CLAMP, MASKED_FILL, REPEAT, ATTENTION, ONE_HOT, DROPOUT, KIND_COUNT
};
inline const char* kind_name(Kind k) {
    static const char* names[] = {
        "leaf", "unary", "scalar", "binary", "compare", "where", "not", "reduce", "argmax",
        "cast", "reshape", "permute", "transpose", "expand", "pad", "shrink", "slice", "flip",
        "squeeze", "unsqueeze", "flatten", "contiguous", "cat", "stack", "matmul", "gather",
        "index_select", "embed", "softmax", "log_softmax", "layer_norm", "cumsum", "topk",
        "index_of", "var", "clamp", "masked_fill", "repeat", "attention", "one_hot", "dropout"};
    return names[int(k)];
}
enum class Leaf : uint8_t { DATA, FULL, ARANGE, RAND, RANDN, EYE };
enum class Unary : uint8_t {
    NEG, EXP, EXP2, LOG, LOG2, SQRT, RSQRT, RECIP, SIN, COS, TANH, SIGMOID, RELU, GELU,
    GELU_TANH, ABS, SQUARE, POW_INT, POW_FRAC, LOG1P, EXPM1, FLOOR, CEIL, TRUNC, UNARY_COUNT
};
// floor, ceil and trunc pass no gradient to their operand, as in PyTorch
inline bool rounds(Unary u) { return u == Unary::FLOOR || u == Unary::CEIL || u == Unary::TRUNC; }
enum class Arith : uint8_t { ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, RSUB };
enum class Cmp : uint8_t { LT, LE, GT, GE, EQ, NE };
enum class Reduce : uint8_t { SUM, MAX, MIN, MEAN };
enum class GradMode : uint8_t { NONE, BACKWARD, GRADIENTS, SECOND_ORDER };

// One call. Its operands are earlier nodes. shape, dtype, lo/hi (bounds on the values), grid
// and tracks are what the generator predicted; build() checks shape and dtype against the
// tensor, and a data leaf draws its values from [lo, hi] on its grid.
struct Node {
    Kind kind = Kind::LEAF;
    int op = 0;                   // the Leaf, Unary, Arith, Cmp or Reduce of this kind
    int form = 0;                 // which overload or argument order
    std::vector<int> in;          // operand node ids
    std::vector<int64_t> ints;    // axes, a shape, an order, an exponent: the call's arguments
    Pairs pairs;                  // pad and shrink
    double value = 0;             // the scalar operand, the pad value, a full leaf's value,
                                  // clamp's min, var's correction, dropout's p
    double value2 = 0;            // clamp's max
    bool value_is_float = true;   // how the scalar is written: 2 and 2.0f promote differently
    bool keepdim = false;
    uint64_t data_seed = 0;       // leaves
    bool grad = false;            // a leaf that requires grad

    Shape shape;
    DType dtype = DType::FLOAT32;
    double lo = 0, hi = 0;
    int grid = -1;                // >= 0: multiples of 2^-grid, computed exactly everywhere
    bool tracks = false;          // depends on a leaf that requires grad
};

struct Graph {
    uint64_t seed = 0;
    std::vector<Node> nodes;
    std::vector<int> outputs;
    GradMode grad_mode = GradMode::NONE;
};

inline int64_t numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}
inline bool is_float(DType dt) { return dt == DType::FLOAT32 || dt == DType::FLOAT64; }
inline bool is_int(DType dt) { return dt == DType::INT32 || dt == DType::INT64; }
inline DType promote(DType a, DType b) { return std::max(a, b); }
inline bool broadcast(const Shape& a, const Shape& b, Shape* out) {
    size_t r = std::max(a.size(), b.size());
    Shape s(r);
    for (size_t i = 0; i < r; i++) {
        int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
        int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
        if (da != db && da != 1 && db != 1) return false;
        s[i] = std::max(da, db);
    }
    if (out) *out = s;
    return true;
}
// The dtype of tensor op scalar, by the manual's rule.
inline DType scalar_dtype(DType t, bool v_is_float) {
    if (v_is_float && !is_float(t)) return DType::FLOAT32;
    if (t == DType::BOOL) return DType::INT64;   // an integer (written as one, not as a bool)
    return t;
}

// tracks: a float node that reads a node that tracks, or a leaf that requires grad.
inline void compute_tracks(Graph& g) {
    for (Node& n : g.nodes) {
        n.tracks = n.kind == Kind::LEAF && n.grad;
        bool detached = n.kind == Kind::UNARY && rounds(Unary(n.op));
        if (n.kind != Kind::LEAF && is_float(n.dtype) && !detached)
            for (int i : n.in) n.tracks = n.tracks || g.nodes[size_t(i)].tracks;
    }
}
// The float outputs the loss sums, and the leaves whose gradients are compared.
inline std::vector<int> loss_terms(const Graph& g) {
    std::vector<int> out;
    for (int o : g.outputs)
        if (is_float(g.nodes[size_t(o)].dtype)) out.push_back(o);
    return out;
}
inline std::vector<int> grad_leaves(const Graph& g) {
    std::vector<int> out;
    for (size_t i = 0; i < g.nodes.size(); i++)
        if (g.nodes[i].kind == Kind::LEAF && g.nodes[i].grad) out.push_back(int(i));
    return out;
}
// The leaves backward() reaches: through tracking nodes from a loss term.
inline std::vector<bool> reached(const Graph& g) {
    std::vector<bool> r(g.nodes.size(), false);
    for (int o : loss_terms(g)) r[size_t(o)] = g.nodes[size_t(o)].tracks;
    for (size_t i = g.nodes.size(); i-- > 0;)
        if (r[i])
            for (int s : g.nodes[i].in) r[size_t(s)] = r[size_t(s)] || g.nodes[size_t(s)].tracks;
    return r;
}
inline bool loss_tracks(const Graph& g) {
    for (int o : loss_terms(g))
        if (g.nodes[size_t(o)].tracks) return true;
    return false;
}

// ---- text -----------------------------------------------------------------------------------

inline std::string join_ints(const std::vector<int64_t>& v) {
    std::string s = "{";
    for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "}";
}
inline std::string shape_text(const Shape& s) { return join_ints(s); }
inline std::string pairs_text(const Pairs& p) {
    std::string s = "{";
    for (size_t i = 0; i < p.size(); i++)
        s += (i ? ", {" : "{") + std::to_string(p[i].first) + ", " + std::to_string(p[i].second) +
             "}";
    return s + "}";
}
inline std::string real_text(double v) {   // a C++ double literal that reads back exactly
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    std::string s = buf;
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
}
inline std::string scalar_text(double v, bool v_is_float) {
    if (!v_is_float) return std::to_string(int64_t(v));
    return real_text(v) + (double(float(v)) == v ? "f" : "");
}
inline std::string dtype_text(DType dt) {
    switch (dt) {
    case DType::BOOL: return "tg::DType::BOOL";
    case DType::INT32: return "tg::DType::INT32";
    case DType::INT64: return "tg::DType::INT64";
    case DType::FLOAT64: return "tg::DType::FLOAT64";
    default: return "tg::DType::FLOAT32";
    }
}
inline std::string var(int id) { return "t" + std::to_string(id); }

// ---- building: one function gives both the tensor and the C++ text --------------------------

inline std::vector<int> as_axes(const std::vector<int64_t>& v) {
    return std::vector<int>(v.begin(), v.end());
}

// Builds node n from the tensors of its operands (when t is not null) and writes the C++
// expression that does the same (when text is not null), so a listing cannot drift from a run.
inline Tensor apply_node(const Node& n, const std::vector<Tensor>* t, std::string* text) {
    const bool run = t != nullptr;
    auto x = [&](size_t k) -> const Tensor& { return (*t)[size_t(n.in[k])]; };
    auto a = [&](size_t k) { return var(n.in[k]); };
    const std::string c = scalar_text(n.value, n.value_is_float);
    const tg::Scalar sc = n.value_is_float ? tg::Scalar(n.value) : tg::Scalar(int64_t(n.value));
    std::string s;
    Tensor r;
    switch (n.kind) {
    case Kind::LEAF: {
        const std::string dims = shape_text(n.shape);
        switch (Leaf(n.op)) {
        case Leaf::DATA: {
            const char* type = n.dtype == DType::FLOAT64 ? "double"
                               : n.dtype == DType::INT64 ? "int64_t"
                               : n.dtype == DType::FLOAT32 ? "float" : "int32_t";
            char args[200];
            std::snprintf(args, sizeof args, "(0x%llxull, %lld, %s, %s, %d)",
                          (unsigned long long)n.data_seed, (long long)numel(n.shape),
                          real_text(n.lo).c_str(), real_text(n.hi).c_str(), n.grid);
            s = std::string("Tensor::from_vector(oracle::leaf_values<") + type + ">" + args +
                ", " + dims + ")";
            if (n.dtype == DType::BOOL) s += ".cast(tg::DType::BOOL)";
            if (run) {
                int64_t m = numel(n.shape);
                if (n.dtype == DType::FLOAT64)
                    r = Tensor::from_vector(leaf_values<double>(n.data_seed, m, n.lo, n.hi, n.grid),
                                            n.shape);
                else if (n.dtype == DType::FLOAT32)
                    r = Tensor::from_vector(leaf_values<float>(n.data_seed, m, n.lo, n.hi, n.grid),
                                            n.shape);
                else if (n.dtype == DType::INT64)
                    r = Tensor::from_vector(
                        leaf_values<int64_t>(n.data_seed, m, n.lo, n.hi, n.grid), n.shape);
                else
                    r = Tensor::from_vector(
                        leaf_values<int32_t>(n.data_seed, m, n.lo, n.hi, n.grid), n.shape);
                if (n.dtype == DType::BOOL) r = r.cast(DType::BOOL);
            }
            break;
        }
        case Leaf::FULL:
            s = "Tensor::full(" + dims + ", " + c + ", " + dtype_text(n.dtype) + ")";
            if (run) r = Tensor::full(n.shape, sc, n.dtype);
            break;
        case Leaf::ARANGE:
            s = "Tensor::arange(" + std::to_string(numel(n.shape)) + ").reshape(" + dims + ")";
            if (run) r = Tensor::arange(numel(n.shape)).reshape(n.shape);
            break;
        case Leaf::RAND:
        case Leaf::RANDN: {
            bool normal = Leaf(n.op) == Leaf::RANDN;
            s = std::string("Tensor::") + (normal ? "randn(" : "rand(") + dims + ", " +
                std::to_string(n.data_seed) + "u)";
            if (run) r = normal ? Tensor::randn(n.shape, n.data_seed)
                                : Tensor::rand(n.shape, n.data_seed);
            break;
        }
        case Leaf::EYE:
            s = "Tensor::eye(" + std::to_string(n.shape[0]) + ")";
            if (run) r = Tensor::eye(n.shape[0]);
            break;
        }
        if (n.grad) {
            s += ".requires_grad()";
            if (run) r.requires_grad();
        }
        break;
    }
    case Kind::UNARY: {
        const std::string v = a(0);
        switch (Unary(n.op)) {
        case Unary::NEG: s = "-" + v; if (run) r = -x(0); break;
        case Unary::EXP: s = v + ".exp()"; if (run) r = x(0).exp(); break;
        case Unary::EXP2: s = v + ".exp2()"; if (run) r = x(0).exp2(); break;
        case Unary::LOG:
            s = "(" + v + " * " + v + " + 0.5f).log()";
            if (run) r = (x(0) * x(0) + 0.5f).log();
            break;
        case Unary::LOG2:
            s = "(" + v + " * " + v + " + 0.5f).log2()";
            if (run) r = (x(0) * x(0) + 0.5f).log2();
            break;
        case Unary::SQRT:
            s = "(" + v + " * " + v + " + 0.5f).sqrt()";
            if (run) r = (x(0) * x(0) + 0.5f).sqrt();
            break;
        case Unary::RSQRT:
            s = "(" + v + " * " + v + " + 0.5f).rsqrt()";
            if (run) r = (x(0) * x(0) + 0.5f).rsqrt();
            break;
        case Unary::RECIP:
            s = "(" + v + ".abs() + 0.5f).reciprocal()";
            if (run) r = (x(0).abs() + 0.5f).reciprocal();
            break;
        case Unary::SIN: s = v + ".sin()"; if (run) r = x(0).sin(); break;
        case Unary::COS: s = v + ".cos()"; if (run) r = x(0).cos(); break;
        case Unary::TANH: s = v + ".tanh()"; if (run) r = x(0).tanh(); break;
        case Unary::SIGMOID: s = v + ".sigmoid()"; if (run) r = x(0).sigmoid(); break;
        case Unary::RELU: s = v + ".relu()"; if (run) r = x(0).relu(); break;
        case Unary::GELU: s = v + ".gelu()"; if (run) r = x(0).gelu(); break;
        case Unary::GELU_TANH: s = v + ".gelu(true)"; if (run) r = x(0).gelu(true); break;
        case Unary::ABS: s = v + ".abs()"; if (run) r = x(0).abs(); break;
        case Unary::SQUARE: s = v + " * " + v; if (run) r = x(0) * x(0); break;
        case Unary::POW_INT:
            s = v + ".pow(" + std::to_string(n.ints[0]) + ")";
            if (run) r = x(0).pow(int(n.ints[0]));
            break;
        case Unary::POW_FRAC:
            s = "(" + v + ".abs() + 0.5f).pow(" + c + ")";
            if (run) r = (x(0).abs() + 0.5f).pow(sc);
            break;
        case Unary::LOG1P:   // 1 + x at least 1/4
            s = v + ".maximum(-0.75f).log1p()";
            if (run) r = x(0).maximum(-0.75f).log1p();
            break;
        case Unary::EXPM1: s = v + ".expm1()"; if (run) r = x(0).expm1(); break;
        case Unary::FLOOR: s = v + ".floor()"; if (run) r = x(0).floor(); break;
        case Unary::CEIL: s = v + ".ceil()"; if (run) r = x(0).ceil(); break;
        case Unary::TRUNC: s = v + ".trunc()"; if (run) r = x(0).trunc(); break;
        default: break;
        }
        break;
    }
    case Kind::SCALAR: {
        const std::string v = a(0);
        switch (Arith(n.op)) {
        case Arith::ADD: s = v + " + " + c; if (run) r = x(0) + sc; break;
        case Arith::SUB: s = v + " - " + c; if (run) r = x(0) - sc; break;
        case Arith::RSUB: s = c + " - " + v; if (run) r = sc - x(0); break;
        case Arith::MUL: s = v + " * " + c; if (run) r = x(0) * sc; break;
        case Arith::DIV: s = v + " / " + c; if (run) r = x(0) / sc; break;
        case Arith::MAXIMUM: s = v + ".maximum(" + c + ")"; if (run) r = x(0).maximum(sc); break;
        case Arith::MINIMUM: s = v + ".minimum(" + c + ")"; if (run) r = x(0).minimum(sc); break;
        }
        break;
    }
    case Kind::BINARY: {
        const std::string u = a(0), v = a(1);
        switch (Arith(n.op)) {
        case Arith::ADD: s = u + " + " + v; if (run) r = x(0) + x(1); break;
        case Arith::SUB: s = u + " - " + v; if (run) r = x(0) - x(1); break;
        case Arith::MUL: s = u + " * " + v; if (run) r = x(0) * x(1); break;
        case Arith::DIV:   // a divisor at least 0.5 (1 for integers) away from 0
            if (is_float(n.dtype) && n.value_is_float) {
                s = u + " / (" + v + ".abs() + 0.5f)";
                if (run) r = x(0) / (x(1).abs() + 0.5f);
            } else {
                s = u + " / (" + v + ".abs() + 1)";
                if (run) r = x(0) / (x(1).abs() + 1);
            }
            break;
        case Arith::MAXIMUM: s = u + ".maximum(" + v + ")"; if (run) r = x(0).maximum(x(1)); break;
        case Arith::MINIMUM: s = u + ".minimum(" + v + ")"; if (run) r = x(0).minimum(x(1)); break;
        default: break;
        }
        break;
    }
    case Kind::COMPARE: {
        static const char* ops[] = {" < ", " <= ", " > ", " >= ", " == ", " != "};
        const bool scalar = n.form == 1;
        s = a(0) + ops[n.op] + (scalar ? c : a(1));
        if (run) {
            const Tensor& l = x(0);
            if (scalar) {
                switch (Cmp(n.op)) {
                case Cmp::LT: r = l < sc; break;
                case Cmp::LE: r = l <= sc; break;
                case Cmp::GT: r = l > sc; break;
                case Cmp::GE: r = l >= sc; break;
                case Cmp::EQ: r = l == sc; break;
                case Cmp::NE: r = l != sc; break;
                }
            } else {
                const Tensor& q = x(1);
                switch (Cmp(n.op)) {
                case Cmp::LT: r = l < q; break;
                case Cmp::LE: r = l <= q; break;
                case Cmp::GT: r = l > q; break;
                case Cmp::GE: r = l >= q; break;
                case Cmp::EQ: r = l == q; break;
                case Cmp::NE: r = l != q; break;
                }
            }
        }
        break;
    }
    case Kind::WHERE:   // form 0: where(c, a, b); 1: where(c, scalar, a); 2: where(c, a, scalar)
        if (n.form == 0) {
            s = "tg::where(" + a(0) + ", " + a(1) + ", " + a(2) + ")";
            if (run) r = tg::where(x(0), x(1), x(2));
        } else if (n.form == 1) {
            s = "tg::where(" + a(0) + ", " + c + ", " + a(1) + ")";
            if (run) r = tg::where(x(0), sc, x(1));
        } else {
            s = "tg::where(" + a(0) + ", " + a(1) + ", " + c + ")";
            if (run) r = tg::where(x(0), x(1), sc);
        }
        break;
    case Kind::NOT:
        s = a(0) + ".logical_not()";
        if (run) r = x(0).logical_not();
        break;
    case Kind::REDUCE: {   // form 0: all; 1: one axis; 2: a list of axes
        static const char* names[] = {"sum", "max", "min", "mean"};
        const std::string keep = n.keepdim ? "true" : "false";
        if (n.form == 0) s = a(0) + "." + names[n.op] + "()";
        else if (n.form == 1)
            s = a(0) + "." + names[n.op] + "(" + std::to_string(n.ints[0]) + ", " + keep + ")";
        else
            s = a(0) + "." + names[n.op] + "(std::vector<int>" + join_ints(n.ints) + ", " + keep +
                ")";
        if (run) {
            const Tensor& v = x(0);
            std::vector<int> axes = as_axes(n.ints);
            switch (Reduce(n.op)) {
            case Reduce::SUM:
                r = n.form == 0 ? v.sum() : n.form == 1 ? v.sum(axes[0], n.keepdim)
                                                        : v.sum(axes, n.keepdim);
                break;
            case Reduce::MAX:
                r = n.form == 0 ? v.max() : n.form == 1 ? v.max(axes[0], n.keepdim)
                                                        : v.max(axes, n.keepdim);
                break;
            case Reduce::MIN:
                r = n.form == 0 ? v.min() : n.form == 1 ? v.min(axes[0], n.keepdim)
                                                        : v.min(axes, n.keepdim);
                break;
            case Reduce::MEAN:
                r = n.form == 0 ? v.mean() : n.form == 1 ? v.mean(axes[0], n.keepdim)
                                                         : v.mean(axes, n.keepdim);
                break;
            }
        }
        break;
    }
    case Kind::ARGMAX:
        if (n.form == 0) {
            s = a(0) + ".argmax()";
            if (run) r = x(0).argmax();
        } else {
            s = a(0) + ".argmax(" + std::to_string(n.ints[0]) + ", " +
                (n.keepdim ? "true" : "false") + ")";
            if (run) r = x(0).argmax(int(n.ints[0]), n.keepdim);
        }
        break;
    case Kind::CAST:
        s = a(0) + ".cast(" + dtype_text(n.dtype) + ")";
        if (run) r = x(0).cast(n.dtype);
        break;
    case Kind::RESHAPE:
        s = a(0) + (n.form ? ".view(" : ".reshape(") + join_ints(n.ints) + ")";
        if (run) r = n.form ? x(0).view(n.ints) : x(0).reshape(n.ints);
        break;
    case Kind::PERMUTE:
        s = a(0) + ".permute(" + join_ints(n.ints) + ")";
        if (run) r = x(0).permute(as_axes(n.ints));
        break;
    case Kind::TRANSPOSE:
        if (n.form == 0) {
            s = a(0) + ".transpose()";
            if (run) r = x(0).transpose();
        } else {
            s = a(0) + ".transpose(" + std::to_string(n.ints[0]) + ", " +
                std::to_string(n.ints[1]) + ")";
            if (run) r = x(0).transpose(int(n.ints[0]), int(n.ints[1]));
        }
        break;
    case Kind::EXPAND:
        s = a(0) + ".expand(" + join_ints(n.ints) + ")";
        if (run) r = x(0).expand(n.ints);
        break;
    case Kind::PAD:
        if (n.form == 0) {
            s = a(0) + ".pad(" + pairs_text(n.pairs) + ")";
            if (run) r = x(0).pad(n.pairs);
        } else {
            s = a(0) + ".pad(" + pairs_text(n.pairs) + ", " + c + ")";
            if (run) r = x(0).pad(n.pairs, sc);
        }
        break;
    case Kind::SHRINK:
        s = a(0) + ".shrink(" + pairs_text(n.pairs) + ")";
        if (run) r = x(0).shrink(n.pairs);
        break;
    case Kind::SLICE:
        s = a(0) + ".slice(" + std::to_string(n.ints[0]) + ", " + std::to_string(n.ints[1]) +
            ", " + std::to_string(n.ints[2]) + ", " + std::to_string(n.ints[3]) + ")";
        if (run) r = x(0).slice(int(n.ints[0]), n.ints[1], n.ints[2], n.ints[3]);
        break;
    case Kind::FLIP:
        if (n.form == 1) {
            s = a(0) + ".flip(" + std::to_string(n.ints[0]) + ")";
            if (run) r = x(0).flip(int(n.ints[0]));
        } else {
            s = a(0) + ".flip(std::vector<int>" + join_ints(n.ints) + ")";
            if (run) r = x(0).flip(as_axes(n.ints));
        }
        break;
    case Kind::SQUEEZE:
        if (n.form == 0) {
            s = a(0) + ".squeeze()";
            if (run) r = x(0).squeeze();
        } else {
            s = a(0) + ".squeeze(" + std::to_string(n.ints[0]) + ")";
            if (run) r = x(0).squeeze(int(n.ints[0]));
        }
        break;
    case Kind::UNSQUEEZE:
        s = a(0) + ".unsqueeze(" + std::to_string(n.ints[0]) + ")";
        if (run) r = x(0).unsqueeze(int(n.ints[0]));
        break;
    case Kind::FLATTEN:
        if (n.form == 0) {
            s = a(0) + ".flatten()";
            if (run) r = x(0).flatten();
        } else {
            s = a(0) + ".flatten(" + std::to_string(n.ints[0]) + ", " +
                std::to_string(n.ints[1]) + ")";
            if (run) r = x(0).flatten(int(n.ints[0]), int(n.ints[1]));
        }
        break;
    case Kind::CONTIGUOUS:
        s = a(0) + ".contiguous()";
        if (run) r = x(0).contiguous();
        break;
    case Kind::CAT:
    case Kind::STACK: {
        std::string list = "{";
        std::vector<Tensor> parts;
        for (size_t k = 0; k < n.in.size(); k++) {
            list += (k ? ", " : "") + a(k);
            if (run) parts.push_back(x(k));
        }
        list += "}";
        bool cat = n.kind == Kind::CAT;
        s = std::string(cat ? "tg::cat(" : "tg::stack(") + list + ", " +
            std::to_string(n.ints[0]) + ")";
        if (run) r = cat ? tg::cat(parts, int(n.ints[0])) : tg::stack(parts, int(n.ints[0]));
        break;
    }
    case Kind::MATMUL:
        s = a(0) + ".matmul(" + a(1) + ")";
        if (run) r = x(0).matmul(x(1));
        break;
    case Kind::GATHER:
        s = a(0) + ".gather(" + std::to_string(n.ints[0]) + ", " + a(1) + ")";
        if (run) r = x(0).gather(int(n.ints[0]), x(1));
        break;
    case Kind::INDEX_SELECT:
        s = a(0) + ".index_select(" + std::to_string(n.ints[0]) + ", " + a(1) + ")";
        if (run) r = x(0).index_select(int(n.ints[0]), x(1));
        break;
    case Kind::EMBED:
        s = a(0) + "[" + a(1) + "]";
        if (run) r = x(0)[x(1)];
        break;
    case Kind::SOFTMAX:
    case Kind::LOG_SOFTMAX: {
        bool log = n.kind == Kind::LOG_SOFTMAX;
        std::string axis = n.form ? std::to_string(n.ints[0]) : "";
        s = a(0) + (log ? ".log_softmax(" : ".softmax(") + axis + ")";
        if (run) {
            int ax = n.form ? int(n.ints[0]) : -1;
            r = log ? x(0).log_softmax(ax) : x(0).softmax(ax);
        }
        break;
    }
    case Kind::LAYER_NORM:
        s = "oracle::layer_norm(" + a(0) + ", " + std::to_string(n.ints[0]) + ")";
        if (run) r = layer_norm(x(0), int(n.ints[0]));
        break;
    case Kind::CUMSUM:
        s = a(0) + ".cumsum(" + std::to_string(n.ints[0]) + ")";
        if (run) r = x(0).cumsum(int(n.ints[0]));
        break;
    case Kind::TOPK: {   // op: largest; form 0: the values, 1: the indices
        s = a(0) + ".topk(" + std::to_string(n.ints[0]) + ", " + std::to_string(n.ints[1]) +
            (n.op ? ", true)" : ", false)") + (n.form ? ".indices" : ".values");
        if (run) {
            tg::ValuesIndices top = x(0).topk(n.ints[0], int(n.ints[1]), n.op != 0);
            r = n.form ? top.indices : top.values;
        }
        break;
    }
    case Kind::INDEX_OF: {   // op 0: argmin, 1: max's indices, 2: min's; form 0: of all
        const std::string axis = n.form ? std::to_string(n.ints[0]) : "";
        const std::string keep = n.keepdim ? "true" : "false";
        if (n.op == 0)
            s = a(0) + ".argmin(" + (n.form ? axis + ", " + keep : "") + ")";
        else
            s = a(0) + (n.op == 1 ? ".max(" : ".min(") + axis + ", " + keep + ").indices";
        if (run) {
            const Tensor& v = x(0);
            int ax = n.form ? int(n.ints[0]) : 0;
            r = n.op == 0 ? (n.form ? v.argmin(ax, n.keepdim) : v.argmin())
                : n.op == 1 ? v.max(ax, n.keepdim).indices : v.min(ax, n.keepdim).indices;
        }
        break;
    }
    case Kind::VAR: {   // op 0: var, 1: std; form 0: of all, 1: one axis, 2: a list
        const char* name = n.op ? "std" : "var";
        const std::string tail = ", " + std::to_string(int64_t(n.value)) + ", " +
                                 (n.keepdim ? "true" : "false") + ")";
        if (n.form == 0) s = a(0) + "." + name + "()";
        else if (n.form == 1) s = a(0) + "." + name + "(" + std::to_string(n.ints[0]) + tail;
        else s = a(0) + "." + name + "(std::vector<int>" + join_ints(n.ints) + tail;
        if (run) {
            const Tensor& v = x(0);
            int64_t c = int64_t(n.value);
            if (n.form == 0) r = n.op ? v.std() : v.var();
            else if (n.form == 1)
                r = n.op ? v.std(int(n.ints[0]), c, n.keepdim)
                         : v.var(int(n.ints[0]), c, n.keepdim);
            else
                r = n.op ? v.std(as_axes(n.ints), c, n.keepdim)
                         : v.var(as_axes(n.ints), c, n.keepdim);
        }
        break;
    }
    case Kind::CLAMP: {   // form 0: min and max, 1: min only, 2: max only, 3: clip(min, max)
        const std::string hi = scalar_text(n.value2, n.value_is_float);
        const tg::Scalar shi =
            n.value_is_float ? tg::Scalar(n.value2) : tg::Scalar(int64_t(n.value2));
        s = a(0) + (n.form == 3 ? ".clip(" : ".clamp(") +
            (n.form == 0 || n.form == 3 ? c + ", " + hi : n.form == 1 ? c : "std::nullopt, " + hi) +
            ")";
        if (run) {
            const Tensor& v = x(0);
            r = n.form == 0 ? v.clamp(sc, shi) : n.form == 1 ? v.clamp(sc)
                : n.form == 2 ? v.clamp(std::nullopt, shi) : v.clip(sc, shi);
        }
        break;
    }
    case Kind::MASKED_FILL:
        s = a(0) + ".masked_fill(" + a(1) + ", " + c + ")";
        if (run) r = x(0).masked_fill(x(1), sc);
        break;
    case Kind::REPEAT:
        s = a(0) + ".repeat(" + join_ints(n.ints) + ")";
        if (run) r = x(0).repeat(n.ints);
        break;
    case Kind::ATTENTION:
        s = "tg::nn::functional::scaled_dot_product_attention(" + a(0) + ", " + a(1) + ", " +
            a(2) + (n.form ? ", true)" : ")");
        if (run) r = tg::nn::functional::scaled_dot_product_attention(x(0), x(1), x(2), n.form);
        break;
    case Kind::ONE_HOT:
        s = "tg::nn::functional::one_hot(" + a(0) + ", " + std::to_string(n.ints[0]) + ")";
        if (run) r = tg::nn::functional::one_hot(x(0), n.ints[0]);
        break;
    case Kind::DROPOUT:
        s = "tg::nn::functional::dropout(" + a(0) + ", " + real_text(n.value) + ", true, " +
            std::to_string(n.data_seed) + "u)";
        if (run) r = tg::nn::functional::dropout(x(0), n.value, true, n.data_seed);
        break;
    default: break;
    }
    if (text) *text = s;
    return r;
}

// ---- the generator ----------------------------------------------------------------------------

struct Options {
    int min_ops = 3, max_ops = 15;
    int64_t max_numel = 2048;          // of any node
    int64_t max_matmul_numel = 65536;  // of a matmul's broadcast product before its sum: big
                                       // enough for tiled products (tile_products)
};

class Generator {
public:
    Generator(uint64_t seed, const Options& opt) : rng_(seed), opt_(opt) { g_.seed = seed; }

    Graph generate() {
        int n_ops = int(rng_.range(opt_.min_ops, opt_.max_ops));
        int start = int(rng_.range(1, 2));
        for (int i = 0; i < start; i++) new_leaf(random_shape(), start_dtype(), true);
        for (int done = 0, tries = 0; done < n_ops && tries < 40 * n_ops; tries++)
            if (random_op()) done++;
        compute_tracks(g_);
        pick_outputs();
        if (loss_tracks(g_)) {
            double p = rng_.uniform(0, 1);
            g_.grad_mode = p < 0.55   ? GradMode::BACKWARD
                           : p < 0.8  ? GradMode::GRADIENTS
                           : p < 0.92 ? GradMode::SECOND_ORDER
                                      : GradMode::NONE;
        }
        return g_;
    }

private:
    Rng rng_;
    Options opt_;
    Graph g_;
    std::set<int> used_;   // nodes some op read

    const Node& at(int i) const { return g_.nodes[size_t(i)]; }
    int last() const { return int(g_.nodes.size()) - 1; }
    double bound(int i) const { return std::max(std::fabs(at(i).lo), std::fabs(at(i).hi)); }
    bool exact(int i) const { return at(i).grid >= 0; }
    int rank(int i) const { return int(at(i).shape.size()); }
    int axis_arg(int axis, int r) { return rng_.chance(0.3) ? axis - r : axis; }   // negatives
    DType start_dtype() {
        double p = rng_.uniform(0, 1);
        return p < 0.8 ? DType::FLOAT32 : p < 0.9 ? DType::FLOAT64 : DType::INT32;
    }

    Shape random_shape(int min_rank = 0, int max_rank = 4) {
        static const int ranks[] = {0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4};
        int r;
        do r = ranks[rng_.range(0, 11)];
        while (r < min_rank || r > max_rank);
        Shape s(static_cast<size_t>(r));
        for (auto& d : s) d = rng_.chance(0.15) ? 1 : rng_.range(1, 7);
        // now and then one long axis, for reductions longer than one 16-term block
        if (r > 0 && rng_.chance(0.12)) s[size_t(rng_.range(0, r - 1))] = rng_.range(17, 40);
        while (numel(s) > opt_.max_numel / 2) {
            auto big = std::max_element(s.begin(), s.end());
            *big = std::max<int64_t>(1, *big / 2);
        }
        return s;
    }

    // Appends a node, then keeps magnitudes moderate: floats scaled by a power of two (which
    // keeps exact values exact), integers clamped. Returns the id of the last node added.
    int add(Node n) {
        if (!n.in.empty() && n.kind != Kind::LEAF)
            for (int i : n.in) used_.insert(i);
        settle_grid(n);
        g_.nodes.push_back(n);
        int id = last();
        if (is_float(n.dtype) && bound(id) > 8) {
            int k = int(std::ceil(std::log2(bound(id) / 4)));
            id = scalar(id, Arith::MUL, std::ldexp(1.0, -k), true);
        } else if (is_int(n.dtype) && bound(id) > 300) {
            if (at(id).hi > 64) id = scalar(id, Arith::MINIMUM, 64, false);
            if (at(id).lo < -64) id = scalar(id, Arith::MAXIMUM, -64, false);
        }
        return id;
    }
    // A grid survives only while every value, times 2^grid, is an integer the type holds.
    void settle_grid(Node& n) {
        if (n.dtype == DType::BOOL || is_int(n.dtype)) { n.grid = 0; return; }
        double limit = n.dtype == DType::FLOAT32 ? 8388608.0 : 4503599627370496.0;
        double b = std::max(std::fabs(n.lo), std::fabs(n.hi));
        if (n.grid > 30 || (n.grid >= 0 && b * std::ldexp(1.0, n.grid) >= limit)) n.grid = -1;
    }
    // A node of op kind k reading ins, with its result's shape and dtype.
    Node node(Kind k, std::vector<int> ins, const Shape& shape, DType dt) {
        Node n;
        n.kind = k;
        n.in = std::move(ins);
        n.shape = shape;
        n.dtype = dt;
        if (!n.in.empty()) {   // by default the values of the first operand
            n.lo = at(n.in[0]).lo;
            n.hi = at(n.in[0]).hi;
            n.grid = at(n.in[0]).grid;
        }
        return n;
    }
    // The values of several operands together (where, cat, pad).
    void join_values(Node& n, const std::vector<int>& ids) {
        n.lo = at(ids[0]).lo, n.hi = at(ids[0]).hi, n.grid = at(ids[0]).grid;
        for (int i : ids) {
            n.lo = std::min(n.lo, at(i).lo);
            n.hi = std::max(n.hi, at(i).hi);
            n.grid = at(i).grid < 0 || n.grid < 0 ? -1 : std::max(n.grid, at(i).grid);
        }
    }

    int new_leaf(const Shape& s, DType dt, bool allow_special) {
        Node n;
        n.kind = Kind::LEAF;
        n.shape = s;
        n.dtype = dt;
        n.data_seed = rng_.next();
        n.op = int(Leaf::DATA);
        double p = allow_special ? rng_.uniform(0, 1) : 0;
        if (is_float(dt)) {
            n.lo = -2, n.hi = 2;
            n.grid = rng_.chance(0.5) ? 2 : -1;
            if (p > 0.97 && s.size() == 2 && s[0] == s[1]) {
                n.op = int(Leaf::EYE), n.lo = 0, n.hi = 1, n.grid = 0;
            } else if (p > 0.93) {
                n.op = int(Leaf::FULL);
                n.value = double(rng_.range(-8, 8)) / 4;
                n.lo = n.hi = n.value, n.grid = 2;
            } else if (p > 0.90) {
                n.op = int(Leaf::RAND);
                n.data_seed = uint64_t(rng_.range(0, 1000000));
                n.lo = 0, n.hi = 1, n.grid = -1;
            } else if (p > 0.87) {
                n.op = int(Leaf::RANDN);
                n.data_seed = uint64_t(rng_.range(0, 1000000));
                n.lo = -6, n.hi = 6, n.grid = -1;
            }
            if (n.op != int(Leaf::DATA) && n.op != int(Leaf::FULL)) n.dtype = DType::FLOAT32;
            n.grad = n.op == int(Leaf::DATA) ? rng_.chance(0.7) : rng_.chance(0.2);
        } else if (dt == DType::BOOL) {
            n.lo = 0, n.hi = 1, n.grid = 0;
        } else {
            n.lo = -4, n.hi = 4, n.grid = 0;
            if (p > 0.9 && dt == DType::INT32) {
                n.op = int(Leaf::ARANGE);
                n.lo = 0, n.hi = double(numel(s) - 1);
            } else if (p > 0.85) {
                n.op = int(Leaf::FULL);
                n.value = double(rng_.range(-3, 3));
                n.value_is_float = false;
                n.lo = n.hi = n.value;
            }
        }
        return add(n);
    }
    // An int32 leaf of indices in [0, n - 1].
    int index_leaf(const Shape& s, int64_t n) {
        return data_leaf(s, DType::INT32, 0, double(n - 1), 0, 0);
    }
    // A data leaf of values in [lo, hi] on grid, which requires grad with chance grad_chance.
    int data_leaf(const Shape& s, DType dt, double lo, double hi, int grid, double grad_chance) {
        Node l;
        l.kind = Kind::LEAF;
        l.op = int(Leaf::DATA);
        l.shape = s;
        l.dtype = dt;
        l.data_seed = rng_.next();
        l.lo = lo, l.hi = hi, l.grid = grid;
        l.grad = grad_chance > 0 && rng_.chance(grad_chance);
        return add(l);
    }

    // An operand satisfying ok: often the newest, so chains grow deep; -1 when none.
    int pick(const std::function<bool(const Node&)>& ok) {
        std::vector<int> c;
        for (int i = 0; i <= last(); i++)
            if (ok(at(i))) c.push_back(i);
        if (c.empty()) return -1;
        if (rng_.chance(0.55)) return c.back();
        return c[size_t(rng_.range(0, int64_t(c.size()) - 1))];
    }
    static bool numeric(const Node& n) { return n.dtype != DType::BOOL; }

    // A shape that broadcasts with s: s itself, a suffix with some sizes 1, or s's size-1 axes
    // grown (the result is larger than s), or a scalar.
    Shape partner_shape(const Shape& s) {
        double p = rng_.uniform(0, 1);
        Shape out;
        if (p < 0.3) {
            out = s;
        } else if (p < 0.65) {
            size_t keep = rng_.chance(0.7) ? s.size() : size_t(rng_.range(0, int64_t(s.size())));
            out.assign(s.end() - long(keep), s.end());
            for (auto& d : out)
                if (rng_.chance(0.3)) d = 1;
        } else if (p < 0.9) {
            out = s;
            for (auto& d : out)
                if (d == 1 && rng_.chance(0.7)) d = rng_.range(2, 5);
            if (out.size() < 4 && rng_.chance(0.4)) out.insert(out.begin(), rng_.range(2, 4));
        }   // else a scalar
        Shape b;
        if (!broadcast(s, out, &b) || numel(b) > opt_.max_numel) out = s;
        return out;
    }
    // A second operand for a: a node from the pool that broadcasts with it, or a new leaf.
    int partner(int a, bool allow_bool, DType leaf_dt) {
        if (rng_.chance(0.35)) {
            const Shape sa = at(a).shape;
            int b = pick([&](const Node& n) {
                Shape r;
                return (allow_bool || n.dtype != DType::BOOL) && broadcast(sa, n.shape, &r) &&
                       numel(r) <= opt_.max_numel && &n != &at(a);
            });
            if (b >= 0) return b;
        }
        return new_leaf(partner_shape(at(a).shape), leaf_dt, true);
    }
    DType leaf_dtype_like(int a) {
        DType dt = at(a).dtype;
        if (dt == DType::BOOL) return DType::FLOAT32;
        if (rng_.chance(0.2)) return DType::FLOAT32;
        return dt;
    }

    int scalar(int x, Arith op, double v, bool v_is_float) {
        Node n = node(Kind::SCALAR, {x}, at(x).shape,
                      op == Arith::DIV && !is_float(at(x).dtype)
                          ? DType::FLOAT32
                          : scalar_dtype(at(x).dtype, v_is_float));
        n.op = int(op);
        n.value = v;
        n.value_is_float = v_is_float;
        double lo = at(x).lo, hi = at(x).hi;
        int g = at(x).grid;
        int gv = 0;   // the constants are multiples of 1/8
        while (gv < 3 && std::ldexp(v, gv) != std::floor(std::ldexp(v, gv))) gv++;
        switch (op) {
        case Arith::ADD: n.lo = lo + v, n.hi = hi + v; n.grid = std::max(g, gv); break;
        case Arith::SUB: n.lo = lo - v, n.hi = hi - v; n.grid = std::max(g, gv); break;
        case Arith::RSUB: n.lo = v - hi, n.hi = v - lo; n.grid = std::max(g, gv); break;
        case Arith::MUL:
            n.lo = std::min(lo * v, hi * v), n.hi = std::max(lo * v, hi * v);
            n.grid = g + gv;
            if (v != 0 && std::fabs(v) == std::ldexp(1.0, std::ilogb(v)))
                n.grid = std::max(g, g - std::ilogb(v));   // a power of two
            break;
        case Arith::DIV: {
            n.lo = std::min(lo / v, hi / v), n.hi = std::max(lo / v, hi / v);
            bool pow2 = std::fabs(v) == std::ldexp(1.0, std::ilogb(v));
            n.grid = pow2 ? std::max(g, g + std::ilogb(v)) : -1;
            break;
        }
        case Arith::MAXIMUM:
            n.lo = std::max(lo, v), n.hi = std::max(hi, v), n.grid = std::max(g, gv);
            break;
        case Arith::MINIMUM:
            n.lo = std::min(lo, v), n.hi = std::min(hi, v), n.grid = std::max(g, gv);
            break;
        }
        if (g < 0) n.grid = -1;
        return add(n);
    }

    bool random_op() {
        static const Kind weighted[] = {
            Kind::UNARY, Kind::UNARY, Kind::UNARY, Kind::UNARY, Kind::UNARY, Kind::SCALAR,
            Kind::SCALAR, Kind::SCALAR, Kind::BINARY, Kind::BINARY, Kind::BINARY, Kind::BINARY,
            Kind::BINARY, Kind::COMPARE, Kind::WHERE, Kind::WHERE, Kind::WHERE, Kind::NOT,
            Kind::REDUCE, Kind::REDUCE, Kind::REDUCE, Kind::REDUCE, Kind::ARGMAX, Kind::CAST,
            Kind::CAST, Kind::RESHAPE, Kind::RESHAPE, Kind::PERMUTE, Kind::PERMUTE,
            Kind::TRANSPOSE, Kind::EXPAND, Kind::EXPAND, Kind::PAD, Kind::PAD, Kind::SHRINK,
            Kind::SLICE, Kind::SLICE, Kind::FLIP, Kind::FLIP, Kind::SQUEEZE, Kind::UNSQUEEZE,
            Kind::FLATTEN, Kind::CONTIGUOUS, Kind::CAT, Kind::CAT, Kind::STACK, Kind::MATMUL,
            Kind::MATMUL, Kind::MATMUL, Kind::GATHER, Kind::GATHER, Kind::INDEX_SELECT,
            Kind::EMBED, Kind::SOFTMAX, Kind::LOG_SOFTMAX, Kind::LAYER_NORM, Kind::CUMSUM,
            Kind::TOPK, Kind::INDEX_OF, Kind::VAR, Kind::CLAMP, Kind::MASKED_FILL, Kind::REPEAT,
            Kind::ATTENTION, Kind::ONE_HOT, Kind::DROPOUT};
        const int count = int(sizeof weighted / sizeof weighted[0]);
        switch (weighted[rng_.range(0, count - 1)]) {
        case Kind::UNARY: return op_unary();
        case Kind::SCALAR: return op_scalar();
        case Kind::BINARY: return op_binary();
        case Kind::COMPARE: return op_compare(pick(numeric)) >= 0;
        case Kind::WHERE: return op_where();
        case Kind::NOT: return op_not();
        case Kind::REDUCE: return op_reduce();
        case Kind::ARGMAX: return op_argmax();
        case Kind::CAST: return op_cast();
        case Kind::RESHAPE: return op_reshape();
        case Kind::PERMUTE: return op_permute();
        case Kind::TRANSPOSE: return op_transpose();
        case Kind::EXPAND: return op_expand();
        case Kind::PAD: return op_pad();
        case Kind::SHRINK: return op_shrink();
        case Kind::SLICE: return op_slice();
        case Kind::FLIP: return op_flip();
        case Kind::SQUEEZE: return op_squeeze();
        case Kind::UNSQUEEZE: return op_unsqueeze();
        case Kind::FLATTEN: return op_flatten();
        case Kind::CONTIGUOUS: {
            int x = pick([](const Node&) { return true; });
            add(node(Kind::CONTIGUOUS, {x}, at(x).shape, at(x).dtype));
            return true;
        }
        case Kind::CAT: return op_cat();
        case Kind::STACK: return op_stack();
        case Kind::MATMUL: return op_matmul();
        case Kind::GATHER: return op_gather();
        case Kind::INDEX_SELECT: return op_index_select();
        case Kind::EMBED: return op_embed();
        case Kind::SOFTMAX:
        case Kind::LOG_SOFTMAX:
        case Kind::LAYER_NORM: return op_normalize();
        case Kind::CUMSUM: return op_cumsum();
        case Kind::TOPK: return op_topk();
        case Kind::INDEX_OF: return op_index_of();
        case Kind::VAR: return op_var();
        case Kind::CLAMP: return op_clamp();
        case Kind::MASKED_FILL: return op_masked_fill();
        case Kind::REPEAT: return op_repeat();
        case Kind::ATTENTION: return op_attention();
        case Kind::ONE_HOT: return op_one_hot();
        case Kind::DROPOUT: return op_dropout();
        default: return false;
        }
    }

    bool op_unary() {
        int x = pick(numeric);
        if (x < 0) return false;
        Unary u = Unary(rng_.range(0, int(Unary::UNARY_COUNT) - 1));
        double lo = at(x).lo, hi = at(x).hi, b = bound(x);
        if (rounds(u) && is_float(at(x).dtype) && !exact(x))   // a tie would decide it
            return false;
        if ((u == Unary::EXP || u == Unary::EXP2 || u == Unary::EXPM1) && hi > 4) {
            x = scalar(x, Arith::MUL, std::ldexp(1.0, -int(std::ceil(std::log2(hi / 4)))), true);
            lo = at(x).lo, hi = at(x).hi, b = bound(x);
        }
        DType fdt = is_float(at(x).dtype) ? at(x).dtype : DType::FLOAT32;
        Node n = node(Kind::UNARY, {x}, at(x).shape, fdt);
        n.op = int(u);
        n.grid = -1;
        switch (u) {
        case Unary::NEG: n.dtype = at(x).dtype, n.lo = -hi, n.hi = -lo, n.grid = at(x).grid; break;
        case Unary::EXP: n.lo = std::exp(lo), n.hi = std::exp(hi); break;
        case Unary::EXP2: n.lo = std::exp2(lo), n.hi = std::exp2(hi); break;
        case Unary::LOG: n.lo = std::log(0.5), n.hi = std::log(b * b + 0.5); break;
        case Unary::LOG2: n.lo = -1, n.hi = std::log2(b * b + 0.5); break;
        case Unary::SQRT: n.lo = std::sqrt(0.5), n.hi = std::sqrt(b * b + 0.5); break;
        case Unary::RSQRT: n.lo = 1 / std::sqrt(b * b + 0.5), n.hi = std::sqrt(2.0); break;
        case Unary::RECIP: n.lo = 1 / (b + 0.5), n.hi = 2; break;
        case Unary::SIN:
        case Unary::COS:
        case Unary::TANH: n.lo = -1, n.hi = 1; break;
        case Unary::SIGMOID: n.lo = 0, n.hi = 1; break;
        case Unary::RELU:
            n.dtype = at(x).dtype, n.lo = std::max(lo, 0.0), n.hi = std::max(hi, 0.0);
            n.grid = at(x).grid;
            break;
        case Unary::GELU:
        case Unary::GELU_TANH: n.lo = -0.2, n.hi = std::max(hi, 0.0); break;
        case Unary::ABS:
            n.dtype = at(x).dtype;
            n.lo = lo > 0 ? lo : hi < 0 ? -hi : 0, n.hi = b, n.grid = at(x).grid;
            break;
        case Unary::SQUARE:
            n.dtype = at(x).dtype, n.lo = 0, n.hi = b * b;
            n.grid = at(x).grid < 0 ? -1 : 2 * at(x).grid;
            break;
        case Unary::POW_INT: {
            int e = int(rng_.range(2, 3));
            n.ints = {e};
            n.dtype = at(x).dtype;
            n.lo = e == 2 ? 0 : -b * b * b, n.hi = std::pow(b, e);
            n.grid = at(x).grid < 0 ? -1 : e * at(x).grid;
            break;
        }
        case Unary::POW_FRAC: {
            static const double exps[] = {0.5, 1.5, -0.5, 2.5, -1.25};
            n.value = exps[rng_.range(0, 4)];
            double p0 = std::pow(0.5, n.value), p1 = std::pow(b + 0.5, n.value);
            n.lo = std::min(p0, p1), n.hi = std::max(p0, p1);
            break;
        }
        case Unary::LOG1P:
            n.lo = std::log1p(std::max(lo, -0.75)), n.hi = std::log1p(std::max(hi, -0.75));
            break;
        case Unary::EXPM1: n.lo = std::expm1(lo), n.hi = std::expm1(hi); break;
        case Unary::FLOOR:
        case Unary::CEIL:
        case Unary::TRUNC: {
            n.dtype = at(x).dtype, n.grid = 0;
            auto round = [u](double v) {
                return u == Unary::FLOOR ? std::floor(v)
                       : u == Unary::CEIL ? std::ceil(v) : std::trunc(v);
            };
            n.lo = round(lo), n.hi = round(hi);
            break;
        }
        default: return false;
        }
        add(n);
        return true;
    }

    bool op_scalar() {
        int x = pick(numeric);
        if (x < 0) return false;
        Arith op = Arith(rng_.range(0, 6));
        bool integer = is_int(at(x).dtype), as_float = !integer || rng_.chance(0.2);
        double v;
        if (as_float) {
            v = double(rng_.range(1, 12)) / 4 * (rng_.chance(0.5) ? 1 : -1);
            if (op == Arith::DIV && rng_.chance(0.5)) v = rng_.chance(0.5) ? 0.5 : -4;
        } else {
            v = double(rng_.range(-3, 3));
            if ((op == Arith::DIV || op == Arith::MUL) && v == 0) v = 2;
        }
        scalar(x, op, v, as_float);
        return true;
    }

    bool op_binary() {
        int a = pick([](const Node&) { return true; });
        Arith op = Arith(rng_.range(0, 5));
        bool has_bool = at(a).dtype == DType::BOOL;
        int b = partner(a, op != Arith::SUB && op != Arith::DIV, leaf_dtype_like(a));
        has_bool = has_bool || at(b).dtype == DType::BOOL;
        if (has_bool && (op == Arith::SUB || op == Arith::DIV)) op = Arith::MUL;
        if (rng_.chance(0.5) && op != Arith::DIV) std::swap(a, b);
        Shape s;
        broadcast(at(a).shape, at(b).shape, &s);
        DType dt = promote(at(a).dtype, at(b).dtype);
        const Node &p = at(a), &q = at(b);
        Node n = node(Kind::BINARY, {a, b}, s, dt);
        n.op = int(op);
        int grid = p.grid < 0 || q.grid < 0 ? -1 : std::max(p.grid, q.grid);
        switch (op) {
        case Arith::ADD: n.lo = p.lo + q.lo, n.hi = p.hi + q.hi, n.grid = grid; break;
        case Arith::SUB: n.lo = p.lo - q.hi, n.hi = p.hi - q.lo, n.grid = grid; break;
        case Arith::MUL: {
            double c[] = {p.lo * q.lo, p.lo * q.hi, p.hi * q.lo, p.hi * q.hi};
            n.lo = *std::min_element(c, c + 4), n.hi = *std::max_element(c, c + 4);
            n.grid = grid < 0 ? -1 : p.grid + q.grid;
            break;
        }
        case Arith::DIV: {
            bool float_divisor = is_float(q.dtype);
            n.value_is_float = float_divisor;   // which divisor form: |b| + 0.5f or |b| + 1
            if (!is_float(dt)) n.dtype = DType::FLOAT32;
            double m = std::max(std::fabs(p.lo), std::fabs(p.hi)) / (float_divisor ? 0.5 : 1);
            n.lo = -m, n.hi = m, n.grid = -1;
            break;
        }
        case Arith::MAXIMUM:
            n.lo = std::max(p.lo, q.lo), n.hi = std::max(p.hi, q.hi), n.grid = grid;
            break;
        case Arith::MINIMUM:
            n.lo = std::min(p.lo, q.lo), n.hi = std::min(p.hi, q.hi), n.grid = grid;
            break;
        default: return false;
        }
        if (dt == DType::BOOL) n.lo = 0, n.hi = 1;
        add(n);
        return true;
    }

    // A bool from x: against a scalar or another operand. Ties decide the result, so == and !=
    // need exact operands, and an inexact one is compared only with values that cannot tie
    // with it except by chance: a constant off its grid or an independent random leaf.
    int op_compare(int x) {
        if (x < 0) return -1;
        Node n = node(Kind::COMPARE, {x}, at(x).shape, DType::BOOL);
        bool ex = exact(x);
        if (rng_.chance(0.5)) {
            n.form = 1;
            n.value = double(rng_.range(-6, 6)) / 4 + (ex ? 0 : 0.125);
            n.value_is_float = is_float(at(x).dtype) || rng_.chance(0.3);
            if (!n.value_is_float) n.value = std::round(n.value);
        } else {
            int y = ex ? partner(x, false, leaf_dtype_like(x))
                       : new_leaf(partner_shape(at(x).shape), leaf_dtype_like(x), false);
            ex = ex && exact(y);
            n.in.push_back(y);
            broadcast(at(x).shape, at(y).shape, &n.shape);
        }
        n.op = int(rng_.range(0, ex ? 5 : 3));
        n.lo = 0, n.hi = 1, n.grid = 0;
        return add(n);
    }

    bool op_where() {
        int a = pick([](const Node&) { return true; });
        const Shape sa = at(a).shape;
        int c = pick([&](const Node& n) {
            Shape r;
            return n.dtype == DType::BOOL && broadcast(sa, n.shape, &r) &&
                   numel(r) <= opt_.max_numel;
        });
        if (c < 0 || rng_.chance(0.3)) {
            int src = rng_.chance(0.6) && at(a).dtype != DType::BOOL ? a : pick(numeric);
            Shape r;
            if (src < 0 || !broadcast(sa, at(src).shape, &r) || numel(r) > opt_.max_numel)
                src = a;
            if (at(src).dtype == DType::BOOL) return false;
            c = op_compare(src);
            if (!broadcast(sa, at(c).shape, &r) || numel(r) > opt_.max_numel) return false;
        }
        Node n = node(Kind::WHERE, {c}, {}, at(a).dtype);
        if (rng_.chance(0.3)) {   // a scalar branch
            n.form = rng_.chance(0.5) ? 1 : 2;
            n.value_is_float = is_float(at(a).dtype) || rng_.chance(0.2);
            n.value = n.value_is_float ? double(rng_.range(-8, 8)) / 4 : double(rng_.range(-3, 3));
            n.in.push_back(a);
            n.dtype = scalar_dtype(at(a).dtype, n.value_is_float);
            broadcast(at(c).shape, sa, &n.shape);
            join_values(n, {a});
            n.lo = std::min(n.lo, n.value), n.hi = std::max(n.hi, n.value);
            if (n.grid >= 0) n.grid = std::max(n.grid, 2);
        } else {
            int b = partner(a, true, leaf_dtype_like(a));
            Shape r;
            broadcast(at(c).shape, sa, &r);
            if (!broadcast(r, at(b).shape, &n.shape) || numel(n.shape) > opt_.max_numel)
                return false;
            if (rng_.chance(0.5)) std::swap(a, b);
            n.in.push_back(a);
            n.in.push_back(b);
            n.dtype = promote(at(a).dtype, at(b).dtype);
            join_values(n, {a, b});
        }
        add(n);
        return true;
    }

    bool op_not() {
        int x = pick([](const Node& n) { return n.dtype == DType::BOOL; });
        if (x < 0) return false;
        Node n = node(Kind::NOT, {x}, at(x).shape, DType::BOOL);
        add(n);
        return true;
    }

    // A random nonempty set of distinct axes of rank r, in random order.
    std::vector<int> random_axes(int r) {
        std::vector<int> axes;
        for (int i = 0; i < r; i++)
            if (rng_.chance(0.45)) axes.push_back(i);
        if (axes.empty()) axes.push_back(int(rng_.range(0, r - 1)));
        for (size_t i = axes.size(); i > 1; i--)
            std::swap(axes[i - 1], axes[size_t(rng_.range(0, int64_t(i) - 1))]);
        return axes;
    }

    // The axes a reduction of x takes: all (form 0), one (form 1: an int) or a list (form 2),
    // with keepdim; n gets them and its shape. Returns the terms of each output.
    int64_t reduce_axes(int x, Node& n) {
        const Shape s = at(x).shape;
        int r = int(s.size());
        std::vector<int> axes;
        if (r == 0 || rng_.chance(0.15)) {
            n.form = 0;
            for (int i = 0; i < r; i++) axes.push_back(i);
        } else {
            axes = random_axes(r);
            n.form = axes.size() == 1 && rng_.chance(0.5) ? 1 : 2;
            n.keepdim = rng_.chance(0.5);
            for (int ax : axes) n.ints.push_back(axis_arg(ax, r));
        }
        int64_t count = 1;
        for (int i = 0; i < r; i++) {
            bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
            if (reduced) count *= s[size_t(i)];
            if (!reduced) n.shape.push_back(s[size_t(i)]);
            else if (n.keepdim) n.shape.push_back(1);
        }
        return count;
    }

    bool op_reduce() {
        int x = pick([](const Node&) { return true; });
        const Node& src = at(x);
        Reduce op = Reduce(rng_.range(0, 3));
        if (src.dtype == DType::BOOL && op == Reduce::MEAN) op = Reduce::SUM;
        Node n = node(Kind::REDUCE, {x}, {}, src.dtype);
        n.op = int(op);
        int64_t count = reduce_axes(x, n);
        switch (op) {
        case Reduce::SUM:
            if (!is_float(src.dtype)) n.dtype = DType::INT64;
            n.lo = src.lo * double(count), n.hi = src.hi * double(count);
            break;
        case Reduce::MEAN: {
            if (!is_float(src.dtype)) n.dtype = DType::FLOAT32;
            bool pow2 = (count & (count - 1)) == 0;
            n.grid = src.grid < 0 || !pow2 ? -1 : src.grid + std::ilogb(double(count));
            break;
        }
        default: break;
        }
        add(n);
        return true;
    }

    // argmax over one axis (or all): ties go to the first index, so its operand is exact.
    int argmax_of(int x, int axis, bool keepdim) {
        Node n = node(Kind::ARGMAX, {x}, {}, DType::INT64);
        int r = rank(x);
        int64_t len = numel(at(x).shape);
        if (axis < 0) {
            n.form = 0;
        } else {
            n.form = 1;
            n.keepdim = keepdim;
            n.ints = {axis_arg(axis, r)};
            len = at(x).shape[size_t(axis)];
            n.shape = at(x).shape;
            if (keepdim) n.shape[size_t(axis)] = 1;
            else n.shape.erase(n.shape.begin() + axis);
        }
        n.lo = 0, n.hi = double(len - 1), n.grid = 0;
        return add(n);
    }
    bool op_argmax() {
        int x = pick([](const Node& n) { return n.dtype != DType::BOOL && n.grid >= 0; });
        if (x < 0) return false;
        int r = rank(x);
        argmax_of(x, r == 0 || rng_.chance(0.2) ? -1 : int(rng_.range(0, r - 1)),
                  rng_.chance(0.5));
        return true;
    }

    bool op_cast() {
        int x = pick([](const Node&) { return true; });
        const Node& src = at(x);
        std::vector<DType> to;
        if (src.dtype == DType::FLOAT32) to = {DType::FLOAT64};
        if (src.dtype == DType::FLOAT64) to = {DType::FLOAT32};
        if (is_float(src.dtype) && src.grid >= 0) to.insert(to.end(), {DType::INT32, DType::BOOL});
        if (is_int(src.dtype))
            to = {DType::FLOAT32, DType::FLOAT64, DType::BOOL,
                  src.dtype == DType::INT32 ? DType::INT64 : DType::INT32};
        if (src.dtype == DType::BOOL) to = {DType::FLOAT32, DType::INT32};
        DType dt = to[size_t(rng_.range(0, int64_t(to.size()) - 1))];
        Node n = node(Kind::CAST, {x}, src.shape, dt);
        if (dt == DType::BOOL) {
            n.lo = 0, n.hi = 1;
        } else if (is_int(dt) && is_float(src.dtype)) {
            n.lo = std::trunc(src.lo), n.hi = std::trunc(src.hi);
        } else if (is_float(dt) && !is_float(src.dtype)) {
            n.grid = 0;
        }
        add(n);
        return true;
    }

    bool op_reshape() {
        int x = pick([](const Node&) { return true; });
        int64_t total = numel(at(x).shape);
        int r = int(rng_.range(total == 1 ? 0 : 1, 4));
        Shape s(size_t(r), 1);
        int64_t m = total;
        for (int64_t f = 2; m > 1; f++)
            while (m % f == 0) {
                s[size_t(rng_.range(0, r - 1))] *= f;
                m /= f;
            }
        Node n = node(Kind::RESHAPE, {x}, s, at(x).dtype);
        n.form = rng_.chance(0.2) ? 1 : 0;
        n.ints = s;
        if (r > 0 && rng_.chance(0.3)) n.ints[size_t(rng_.range(0, r - 1))] = -1;
        add(n);
        return true;
    }

    bool op_permute() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        std::vector<int> order(static_cast<size_t>(r));
        for (int i = 0; i < r; i++) order[size_t(i)] = i;
        for (int i = r - 1; i > 0; i--)
            std::swap(order[size_t(i)], order[size_t(rng_.range(0, i))]);
        Node n = node(Kind::PERMUTE, {x}, {}, at(x).dtype);
        for (int i = 0; i < r; i++) {
            n.shape.push_back(at(x).shape[size_t(order[size_t(i)])]);
            n.ints.push_back(axis_arg(order[size_t(i)], r));
        }
        add(n);
        return true;
    }

    bool op_transpose() {
        int x = pick([](const Node& n) { return n.shape.size() >= 2; });
        if (x < 0) return false;
        int r = rank(x);
        Node n = node(Kind::TRANSPOSE, {x}, at(x).shape, at(x).dtype);
        int a0 = r - 2, a1 = r - 1;
        if (rng_.chance(0.6)) {
            n.form = 1;
            a0 = int(rng_.range(0, r - 1));
            do a1 = int(rng_.range(0, r - 1));
            while (a1 == a0);
            n.ints = {axis_arg(a0, r), axis_arg(a1, r)};
        }
        std::swap(n.shape[size_t(a0)], n.shape[size_t(a1)]);
        add(n);
        return true;
    }

    bool op_expand() {
        int x = pick([](const Node&) { return true; });
        Shape s = at(x).shape;
        Node n = node(Kind::EXPAND, {x}, {}, at(x).dtype);
        bool grown = false;
        for (auto d : s) {
            int64_t to = d == 1 && rng_.chance(0.7) ? rng_.range(2, 5) : d;
            grown = grown || to != d;
            n.ints.push_back(to == d && rng_.chance(0.3) ? -1 : to);
            n.shape.push_back(to);
        }
        if ((!grown || rng_.chance(0.3)) && s.size() < 4) {
            int64_t lead = rng_.range(2, 4);
            n.ints.insert(n.ints.begin(), lead);
            n.shape.insert(n.shape.begin(), lead);
            grown = true;
        }
        if (!grown || numel(n.shape) > opt_.max_numel) return false;
        add(n);
        return true;
    }

    bool op_pad() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        Node n = node(Kind::PAD, {x}, at(x).shape, at(x).dtype);
        bool any = false;
        for (size_t i = 0; i < n.shape.size(); i++) {
            std::pair<int64_t, int64_t> p{0, 0};
            if (rng_.chance(0.6)) p = {rng_.range(0, 3), rng_.range(0, 3)};
            any = any || p.first || p.second;
            n.pairs.push_back(p);
            n.shape[i] += p.first + p.second;
        }
        if (!any || numel(n.shape) > opt_.max_numel) return false;
        double v = 0;
        if (rng_.chance(0.6) && at(x).dtype != DType::BOOL) {
            n.form = 1;
            if (is_float(at(x).dtype)) {
                static const double values[] = {0, 0.5, -1.25, 2};
                v = values[rng_.range(0, 3)];
            } else {
                static const double values[] = {0, 1, -3};
                v = values[rng_.range(0, 2)];
                n.value_is_float = false;
            }
        }
        n.value = v;
        n.lo = std::min(n.lo, v), n.hi = std::max(n.hi, v);
        if (n.grid >= 0) n.grid = std::max(n.grid, 2);
        add(n);
        return true;
    }

    bool op_shrink() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        Node n = node(Kind::SHRINK, {x}, {}, at(x).dtype);
        for (int64_t d : at(x).shape) {
            int64_t b = rng_.chance(0.6) ? rng_.range(0, d - 1) : 0;
            int64_t e = rng_.chance(0.6) ? rng_.range(b + 1, d) : d;
            n.pairs.push_back({b, e});
            n.shape.push_back(e - b);
        }
        add(n);
        return true;
    }

    bool op_slice() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r - 1));
        int64_t d = at(x).shape[size_t(ax)];
        int64_t b = rng_.range(0, d - 1), e = rng_.range(b + 1, d), step = rng_.range(1, 3);
        Node n = node(Kind::SLICE, {x}, at(x).shape, at(x).dtype);
        n.shape[size_t(ax)] = (e - b + step - 1) / step;
        int64_t start = b > 0 && rng_.chance(0.3) ? b - d : b;
        int64_t end = e < d && rng_.chance(0.3) ? e - d : e;
        n.ints = {axis_arg(ax, r), start, end, step};
        add(n);
        return true;
    }

    bool op_flip() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        Node n = node(Kind::FLIP, {x}, at(x).shape, at(x).dtype);
        for (int ax : random_axes(r)) n.ints.push_back(axis_arg(ax, r));
        n.form = n.ints.size() == 1 && rng_.chance(0.5) ? 1 : 0;
        add(n);
        return true;
    }

    bool op_squeeze() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        Node n = node(Kind::SQUEEZE, {x}, {}, at(x).dtype);
        const Shape& s = at(x).shape;
        int r = int(s.size());
        if (rng_.chance(0.4)) {
            for (int64_t d : s)
                if (d != 1) n.shape.push_back(d);
        } else {   // an axis of size 1 when there is one; squeezing another changes nothing
            int ax = int(rng_.range(0, r - 1));
            for (int i = 0; i < r; i++)
                if (s[size_t(i)] == 1 && rng_.chance(0.7)) ax = i;
            n.form = 1;
            n.ints = {axis_arg(ax, r)};
            n.shape = s;
            if (s[size_t(ax)] == 1) n.shape.erase(n.shape.begin() + ax);
        }
        add(n);
        return true;
    }

    bool op_unsqueeze() {
        int x = pick([](const Node& n) { return n.shape.size() < 5; });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r));
        Node n = node(Kind::UNSQUEEZE, {x}, at(x).shape, at(x).dtype);
        n.shape.insert(n.shape.begin() + ax, 1);
        n.ints = {rng_.chance(0.3) ? ax - (r + 1) : ax};
        add(n);
        return true;
    }

    bool op_flatten() {
        int x = pick([](const Node&) { return true; });
        int r = rank(x);
        const Shape& s = at(x).shape;
        Node n = node(Kind::FLATTEN, {x}, {}, at(x).dtype);
        if (r == 0 || rng_.chance(0.25)) {
            n.shape = {numel(s)};
        } else {
            int b = int(rng_.range(0, r - 1)), e = int(rng_.range(b, r - 1));
            n.form = 1;
            n.ints = {axis_arg(b, r), axis_arg(e, r)};
            n.shape.assign(s.begin(), s.begin() + b);
            int64_t m = 1;
            for (int i = b; i <= e; i++) m *= s[size_t(i)];
            n.shape.push_back(m);
            n.shape.insert(n.shape.end(), s.begin() + e + 1, s.end());
        }
        add(n);
        return true;
    }

    bool op_cat() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r - 1));
        std::vector<int> parts = {x};
        int pieces = int(rng_.range(1, 2));
        Shape out = at(x).shape;
        for (int k = 0; k < pieces; k++) {
            const Shape sx = at(x).shape;
            int p = rng_.chance(0.4) ? pick([&](const Node& n) {
                if (n.shape.size() != sx.size()) return false;
                for (size_t i = 0; i < sx.size(); i++)
                    if (int(i) != ax && n.shape[i] != sx[i]) return false;
                return true;
            }) : -1;
            if (p < 0) {
                Shape s = sx;
                s[size_t(ax)] = rng_.range(1, 4);
                p = new_leaf(s, leaf_dtype_like(x), true);
            }
            out[size_t(ax)] += at(p).shape[size_t(ax)];
            parts.insert(parts.begin() + rng_.range(0, int64_t(parts.size())), p);
        }
        if (numel(out) > opt_.max_numel) return false;
        DType dt = at(parts[0]).dtype;
        for (int p : parts) dt = promote(dt, at(p).dtype);
        Node n = node(Kind::CAT, parts, out, dt);
        n.ints = {axis_arg(ax, r)};
        join_values(n, parts);
        add(n);
        return true;
    }

    bool op_stack() {
        int x = pick([](const Node& n) { return n.shape.size() < 4; });
        if (x < 0) return false;
        int r = rank(x);
        std::vector<int> parts = {x};
        int pieces = int(rng_.range(1, 2));
        for (int k = 0; k < pieces; k++) {
            const Shape sx = at(x).shape;
            int p = rng_.chance(0.4) ? pick([&](const Node& n) { return n.shape == sx; }) : -1;
            if (p < 0) p = new_leaf(sx, leaf_dtype_like(x), true);
            parts.insert(parts.begin() + rng_.range(0, int64_t(parts.size())), p);
        }
        int ax = int(rng_.range(0, r));
        Shape out = at(x).shape;
        out.insert(out.begin() + ax, int64_t(parts.size()));
        if (numel(out) > opt_.max_numel) return false;
        DType dt = at(parts[0]).dtype;
        for (int p : parts) dt = promote(dt, at(p).dtype);
        Node n = node(Kind::STACK, parts, out, dt);
        n.ints = {rng_.chance(0.3) ? ax - (r + 1) : ax};
        join_values(n, parts);
        add(n);
        return true;
    }

    // matmul's result shape, or false when the shapes do not multiply
    static bool matmul_shape(Shape a, Shape b, Shape* out) {
        if (a.empty() || b.empty()) return false;
        bool a1 = a.size() == 1, b1 = b.size() == 1;
        if (a1) a.insert(a.begin(), 1);
        if (b1) b.push_back(1);
        if (a.back() != b[b.size() - 2]) return false;
        Shape batch;
        if (!broadcast(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2), &batch))
            return false;
        *out = batch;
        if (!a1) out->push_back(a[a.size() - 2]);
        if (!b1) out->push_back(b.back());
        return true;
    }
    bool op_matmul() {
        int x = pick([](const Node& n) { return !n.shape.empty() && n.dtype != DType::BOOL; });
        if (x < 0) return false;
        const Shape sx = at(x).shape;
        bool x_left = rng_.chance(0.7);
        int64_t k = x_left ? sx.back() : sx.size() == 1 ? sx[0] : sx[sx.size() - 2];
        Shape other;
        double p = rng_.uniform(0, 1);
        if (p < 0.2) {
            other = {k};
        } else {
            other = {rng_.range(1, 6)};   // n or m
            if (x_left) other.insert(other.begin(), k);
            else other.push_back(k);
            if (p > 0.6 && sx.size() >= 2) {   // batch axes: x's, some 1, or fewer
                Shape batch(sx.begin(), sx.end() - 2);
                size_t keep = rng_.chance(0.7) ? batch.size()
                                               : size_t(rng_.range(0, int64_t(batch.size())));
                batch.erase(batch.begin(), batch.end() - long(keep));
                for (auto& d : batch)
                    if (rng_.chance(0.3)) d = 1;
                other.insert(other.begin(), batch.begin(), batch.end());
            } else if (p > 0.85 && sx.size() < 3) {
                other.insert(other.begin(), rng_.range(2, 3));
            }
        }
        Shape out;
        Shape sa = x_left ? sx : other, sb = x_left ? other : sx;
        if (!matmul_shape(sa, sb, &out)) return false;
        if (numel(out) * k > opt_.max_matmul_numel || numel(out) > opt_.max_numel) return false;
        int y = rng_.chance(0.3) ? pick([&](const Node& n) {
            return n.shape == other && n.dtype != DType::BOOL;
        }) : -1;
        if (y < 0) y = new_leaf(other, is_float(at(x).dtype) ? at(x).dtype : leaf_dtype_like(x),
                                true);
        int a = x_left ? x : y, b = x_left ? y : x;
        Node n = node(Kind::MATMUL, {a, b}, out, promote(at(a).dtype, at(b).dtype));
        double m = double(k) * bound(a) * bound(b);
        n.lo = -m, n.hi = m;
        n.grid = exact(a) && exact(b) ? at(a).grid + at(b).grid : -1;
        add(n);
        return true;
    }

    // An index tensor of shape want for an axis of src: a leaf, or an integer node of the graph
    // folded into range by abs and minimum.
    int index_for(int src, int axis, const Shape& want) {
        double p = rng_.uniform(0, 1);
        int64_t len = at(src).shape[size_t(axis)];
        if (p < 0.4) {
            int i = pick([&](const Node& n) { return is_int(n.dtype) && n.shape == want; });
            if (i >= 0) {
                if (at(i).lo < 0) {
                    Node n = node(Kind::UNARY, {i}, at(i).shape, at(i).dtype);
                    n.op = int(Unary::ABS);
                    n.lo = 0, n.hi = bound(i);
                    i = add(n);
                }
                if (at(i).hi > double(len - 1))
                    i = scalar(i, Arith::MINIMUM, double(len - 1), false);
                return i;
            }
        }
        return index_leaf(want, len);
    }
    bool op_gather() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r - 1));
        const Shape s = at(x).shape;
        bool by_argmax = rng_.chance(0.25) && at(x).dtype != DType::BOOL && exact(x);
        int idx;
        if (by_argmax) {
            idx = argmax_of(x, ax, true);
        } else {
            Shape want = s;
            for (int i = 0; i < r; i++)
                want[size_t(i)] = i == ax ? rng_.range(1, 6)
                                          : rng_.chance(0.6) ? s[size_t(i)]
                                                             : rng_.range(1, s[size_t(i)]);
            if (numel(want) > opt_.max_numel) return false;
            idx = index_for(x, ax, want);
        }
        Node n = node(Kind::GATHER, {x, idx}, at(idx).shape, at(x).dtype);
        n.ints = {axis_arg(ax, r)};
        add(n);
        return true;
    }
    bool op_index_select() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r - 1));
        int idx = index_for(x, ax, {rng_.range(1, 6)});
        Node n = node(Kind::INDEX_SELECT, {x, idx}, at(x).shape, at(x).dtype);
        n.shape[size_t(ax)] = at(idx).shape[0];
        n.ints = {axis_arg(ax, r)};
        if (numel(n.shape) > opt_.max_numel) return false;
        add(n);
        return true;
    }
    bool op_embed() {
        int x = pick([](const Node& n) { return !n.shape.empty(); });
        if (x < 0) return false;
        Shape ids(size_t(rng_.range(0, 2)));
        for (auto& d : ids) d = rng_.range(1, 5);
        int idx = index_for(x, 0, ids);
        Shape out = at(idx).shape;
        out.insert(out.end(), at(x).shape.begin() + 1, at(x).shape.end());
        if (numel(out) > opt_.max_numel) return false;
        add(node(Kind::EMBED, {x, idx}, out, at(x).dtype));
        return true;
    }

    bool op_normalize() {
        int x = pick([](const Node& n) { return !n.shape.empty() && n.dtype != DType::BOOL; });
        if (x < 0) return false;
        int r = rank(x);
        int ax = int(rng_.range(0, r - 1));
        int64_t len = at(x).shape[size_t(ax)];
        double p = rng_.uniform(0, 1);
        DType dt = is_float(at(x).dtype) ? at(x).dtype : DType::FLOAT32;
        Kind k = p < 0.35 ? Kind::SOFTMAX : p < 0.7 ? Kind::LOG_SOFTMAX : Kind::LAYER_NORM;
        Node n = node(k, {x}, at(x).shape, dt);
        n.form = k == Kind::LAYER_NORM || ax != r - 1 || rng_.chance(0.5) ? 1 : 0;
        n.ints = {axis_arg(ax, r)};
        n.grid = -1;
        double spread = at(x).hi - at(x).lo;
        if (k == Kind::SOFTMAX) n.lo = 0, n.hi = 1;
        if (k == Kind::LOG_SOFTMAX) n.lo = -spread - std::log(double(len)), n.hi = 0;
        if (k == Kind::LAYER_NORM) {
            double m = std::min(spread * std::sqrt(2.0), std::sqrt(double(len)) + 1);
            n.lo = -m, n.hi = m;
        }
        add(n);
        return true;
    }

    // An axis of x (0 for a scalar) and its length.
    std::pair<int, int64_t> random_axis(int x) {
        if (rank(x) == 0) return {0, 1};
        int ax = int(rng_.range(0, rank(x) - 1));
        return {ax, at(x).shape[size_t(ax)]};
    }

    // Sums along an axis; now and then of a row longer than cumsum's blocks of 256 terms.
    bool op_cumsum() {
        int x, ax;
        int64_t len;
        if (rng_.chance(0.15)) {
            len = rng_.range(257, 520);
            Shape s = {len};
            ax = 0;
            if (rng_.chance(0.5)) {   // and an axis of 2 before or after it
                ax = int(rng_.range(0, 1));
                s.insert(ax ? s.begin() : s.end(), 2);
            }
            x = new_leaf(s, rng_.chance(0.8) ? DType::FLOAT32 : DType::INT32, true);
        } else {
            x = pick([](const Node&) { return true; });
            std::tie(ax, len) = random_axis(x);
        }
        Node n = node(Kind::CUMSUM, {x}, at(x).shape,
                      is_float(at(x).dtype) ? at(x).dtype : DType::INT64);
        n.ints = {rank(x) == 0 ? -int64_t(rng_.range(0, 1)) : axis_arg(ax, rank(x))};
        n.lo = std::min(n.lo, n.lo * double(len)), n.hi = std::max(n.hi, n.hi * double(len));
        add(n);
        return true;
    }

    // The k largest or smallest along an axis, or their indices: ties decide both, so the
    // operand is exact.
    bool op_topk() {
        int x = pick([](const Node& n) { return n.dtype != DType::BOOL && n.grid >= 0; });
        if (x < 0) return false;
        auto [ax, len] = random_axis(x);
        int64_t k = rng_.range(1, std::min<int64_t>(len, 3));
        Node n = node(Kind::TOPK, {x}, at(x).shape, at(x).dtype);
        n.op = rng_.chance(0.6) ? 1 : 0;
        n.form = rng_.chance(0.4) ? 1 : 0;
        n.ints = {k, rank(x) == 0 ? 0 : axis_arg(ax, rank(x))};
        if (rank(x) > 0) n.shape[size_t(ax)] = k;
        if (n.form) n.dtype = DType::INT64, n.lo = 0, n.hi = double(len - 1), n.grid = 0;
        add(n);
        return true;
    }

    // argmin, or the indices of max(axis) or min(axis): first index of a tie; exact operands.
    bool op_index_of() {
        int x = pick([](const Node& n) { return n.dtype != DType::BOOL && n.grid >= 0; });
        if (x < 0) return false;
        int r = rank(x);
        Node n = node(Kind::INDEX_OF, {x}, {}, DType::INT64);
        n.op = r == 0 ? 0 : int(rng_.range(0, 2));
        int64_t len = numel(at(x).shape);
        bool of_all = n.op == 0 && (r == 0 || rng_.chance(0.2));   // argmin() of all
        if (!of_all) {
            int ax;
            std::tie(ax, len) = random_axis(x);
            n.form = 1;
            n.keepdim = rng_.chance(0.5);
            n.ints = {axis_arg(ax, r)};
            n.shape = at(x).shape;
            if (n.keepdim) n.shape[size_t(ax)] = 1;
            else n.shape.erase(n.shape.begin() + ax);
        }
        n.lo = 0, n.hi = double(len - 1), n.grid = 0;
        add(n);
        return true;
    }

    // var or std over some axes with correction 0 or 1 (never more than the terms). std's
    // gradient is infinite where the terms are equal, so it reads a leaf off any grid (no two
    // values equal but by chance).
    bool op_var() {
        bool std_dev = rng_.chance(0.4);
        int x = std_dev ? data_leaf(random_shape(1), DType::FLOAT32, -2, 2, -1, 0.7)
                        : pick([](const Node& n) { return numeric(n); });
        if (x < 0) return false;
        Node n = node(Kind::VAR, {x}, {}, is_float(at(x).dtype) ? at(x).dtype : DType::FLOAT32);
        n.op = std_dev ? 1 : 0;
        int64_t count = reduce_axes(x, n);
        n.value = n.form == 0 ? 1 : double(rng_.range(0, 1));
        if (count < 2 && (std_dev || n.value > 0)) return false;
        double spread = at(x).hi - at(x).lo;
        n.lo = 0, n.grid = -1;
        n.hi = spread * spread / 4 * double(count) / (double(count) - n.value);
        if (std_dev) n.hi = std::sqrt(n.hi);
        add(n);
        return true;
    }

    // clamp with a min, a max or both (now and then min > max: everything is max), or clip.
    bool op_clamp() {
        int x = pick(numeric);
        if (x < 0) return false;
        Node n = node(Kind::CLAMP, {x}, at(x).shape, at(x).dtype);
        n.form = int(rng_.range(0, 3));
        n.value_is_float = !is_int(at(x).dtype) || rng_.chance(0.2);
        double lo = double(rng_.range(-8, 8)) / 4, hi = double(rng_.range(-8, 8)) / 4;
        if (!n.value_is_float) lo = std::round(lo), hi = std::round(hi);
        if (lo > hi && rng_.chance(0.8)) std::swap(lo, hi);
        n.value = lo, n.value2 = hi;
        if (n.form != 2) {
            n.dtype = scalar_dtype(n.dtype, n.value_is_float);
            n.lo = std::max(n.lo, lo), n.hi = std::max(n.hi, lo);
        }
        if (n.form != 1) {
            n.dtype = scalar_dtype(n.dtype, n.value_is_float);
            n.lo = std::min(n.lo, hi), n.hi = std::min(n.hi, hi);
        }
        if (n.grid >= 0) n.grid = std::max(n.grid, 2);
        add(n);
        return true;
    }

    // x with a value where a bool mask of x's shape (or one that broadcasts to it) is true; a
    // float value for an integer x is cast to it (2.5 is 2).
    bool op_masked_fill() {
        int x = pick(numeric);
        if (x < 0) return false;
        const Shape sx = at(x).shape;
        auto fits = [&](const Node& m) {
            Shape r;
            return m.dtype == DType::BOOL && broadcast(sx, m.shape, &r) && r == sx;
        };
        int mask = rng_.chance(0.6) ? pick(fits) : -1;
        if (mask < 0) mask = op_compare(x);
        if (!fits(at(mask))) return false;
        Node n = node(Kind::MASKED_FILL, {x, mask}, sx, at(x).dtype);
        n.value_is_float = is_float(at(x).dtype) || rng_.chance(0.3);
        n.value = n.value_is_float ? double(rng_.range(-10, 10)) / 4 : double(rng_.range(-3, 3));
        double stored = is_float(at(x).dtype) ? n.value : std::trunc(n.value);
        n.lo = std::min(n.lo, stored), n.hi = std::max(n.hi, stored);
        if (n.grid >= 0) n.grid = std::max(n.grid, 2);
        add(n);
        return true;
    }

    // Each axis (and now and then a new leading one) repeated 1 to 3 times.
    bool op_repeat() {
        int x = pick([](const Node&) { return true; });
        Shape s = at(x).shape;
        if (s.size() < 4 && rng_.chance(0.3)) s.insert(s.begin(), 1);
        Node n = node(Kind::REPEAT, {x}, {}, at(x).dtype);
        for (int64_t d : s) {
            int64_t times = rng_.chance(0.5) ? 1 : rng_.range(2, 3);
            n.ints.push_back(times);
            n.shape.push_back(d * times);
        }
        if (numel(n.shape) > opt_.max_numel) return false;
        add(n);
        return true;
    }

    // softmax(q kᵀ/√d) v, causal or not: q from the graph, k and v new leaves of its batch
    // axes. Each output row is a mean of v's rows, weighted.
    bool op_attention() {
        int q = pick([](const Node& n) {
            return n.shape.size() >= 2 && n.shape.size() <= 4 && is_float(n.dtype);
        });
        if (q < 0) return false;
        Shape sk = at(q).shape, sv, out = at(q).shape;
        size_t r = sk.size();
        int64_t queries = sk[r - 2], depth = sk[r - 1];
        sk[r - 2] = rng_.range(1, 6);
        sv = sk;
        sv[r - 1] = out[r - 1] = rng_.range(1, 6);
        int64_t batch = numel(out) / (queries * out[r - 1]);
        if (numel(out) > opt_.max_numel || numel(sk) > opt_.max_numel ||
            batch * queries * sk[r - 2] * std::max(depth, sv[r - 1]) > opt_.max_matmul_numel)
            return false;
        int k = new_leaf(sk, at(q).dtype, false), v = new_leaf(sv, at(q).dtype, false);
        Node n = node(Kind::ATTENTION, {q, k, v}, out, at(q).dtype);
        n.form = rng_.chance(0.5) ? 1 : 0;
        n.lo = at(v).lo, n.hi = at(v).hi, n.grid = -1;
        add(n);
        return true;
    }

    // int64 rows of classes: ids of the graph that are small and not negative, or a new leaf.
    bool op_one_hot() {
        int ids = rng_.chance(0.5) ? pick([](const Node& n) {
            return is_int(n.dtype) && n.lo >= 0 && n.hi <= 8 && n.shape.size() <= 3;
        }) : -1;
        if (ids < 0) {
            Shape s(size_t(rng_.range(0, 2)));
            for (auto& d : s) d = rng_.range(1, 5);
            ids = index_leaf(s, rng_.range(1, 6));
        }
        int64_t classes = int64_t(at(ids).hi) + 1 + rng_.range(0, 2);
        Shape out = at(ids).shape;
        out.push_back(classes);
        if (numel(out) > opt_.max_numel) return false;
        Node n = node(Kind::ONE_HOT, {ids}, out, DType::INT64);
        n.ints = {classes};
        n.lo = 0, n.hi = 1, n.grid = 0;
        add(n);
        return true;
    }

    // Training dropout: a mask drawn from a seed, the kept values scaled by 1/(1 - p).
    bool op_dropout() {
        int x = pick([](const Node& n) { return is_float(n.dtype); });
        if (x < 0) return false;
        Node n = node(Kind::DROPOUT, {x}, at(x).shape, at(x).dtype);
        n.value = rng_.chance(0.5) ? 0.5 : 0.25;
        n.data_seed = uint64_t(rng_.range(0, 1000000));
        double scale = 1 / (1 - n.value);
        n.lo = std::min(n.lo * scale, 0.0), n.hi = std::max(n.hi * scale, 0.0);
        if (n.value != 0.5) n.grid = -1;
        add(n);
        return true;
    }

    // The newest node, and now and then one or two earlier ones, unread ones first.
    void pick_outputs() {
        g_.outputs = {last()};
        for (int extra = 0; extra < 2; extra++) {
            if (!rng_.chance(extra == 0 ? 0.4 : 0.2)) continue;
            std::vector<int> c;
            for (int i = 0; i < last(); i++)
                if (!used_.count(i) && at(i).kind != Kind::LEAF) c.push_back(i);
            if (c.empty())
                for (int i = 0; i < last(); i++)
                    if (at(i).kind != Kind::LEAF) c.push_back(i);
            if (c.empty()) continue;
            int o = c[size_t(rng_.range(0, int64_t(c.size()) - 1))];
            if (std::find(g_.outputs.begin(), g_.outputs.end(), o) == g_.outputs.end())
                g_.outputs.push_back(o);
        }
        // a graph that ends in a bool or an integer still differentiates, mostly
        if (!loss_tracks(g_) && rng_.chance(0.85))
            for (int i = last(); i >= 0; i--)
                if (at(i).tracks && is_float(at(i).dtype) && at(i).kind != Kind::LEAF) {
                    g_.outputs.push_back(i);
                    break;
                }
    }
};

inline Graph generate(uint64_t seed, const Options& opt = Options()) {
    return Generator(seed, opt).generate();
}

// ---- building a graph, with its loss and gradients -------------------------------------------

// The weights of loss term k (output outputs[k]) and of the second-order term of leaf j.
inline uint64_t weight_seed(const Graph& g, int k) { return mix_seed(g.seed, 1000 + k); }
inline uint64_t second_seed(const Graph& g, int j) { return mix_seed(g.seed, 2000 + j); }

inline Tensor weights(uint64_t seed, const Shape& s) {
    return Tensor::from_vector(leaf_values<float>(seed, numel(s), -1, 1, -1), s);
}
inline std::string weights_text(uint64_t seed, const Shape& s) {
    char args[120];
    std::snprintf(args, sizeof args, "(0x%llxull, %lld, -1, 1, -1)", (unsigned long long)seed,
                  (long long)numel(s));
    return std::string("Tensor::from_vector(oracle::leaf_values<float>") + args + ", " +
           shape_text(s) + ")";
}

// What a run compares: named tensors (undefined: a gradient backward() did not reach).
struct Built {
    std::vector<std::string> names;
    std::vector<Tensor> tensors;
};

// The scalar loss of g's tensors t: each float output times its fixed random weights, summed.
inline Tensor loss_of(const Graph& g, const std::vector<Tensor>& t) {
    std::vector<int> terms = loss_terms(g);
    Tensor loss;
    for (size_t k = 0; k < terms.size(); k++) {
        const Tensor& out = t[size_t(terms[k])];
        Tensor term = (out * weights(weight_seed(g, int(k)), out.shape())).sum();
        loss = loss.defined() ? loss + term : term;
    }
    return loss;
}

inline Built build(const Graph& g) {
    std::vector<Tensor> t;
    for (const Node& n : g.nodes) {
        t.push_back(apply_node(n, &t, nullptr));
        const Tensor& r = t.back();
        if (r.shape() != n.shape || r.dtype() != n.dtype) {
            std::string text;
            apply_node(n, nullptr, &text);
            throw std::logic_error("oracle: t" + std::to_string(t.size() - 1) + " = " + text +
                                   " is " + tg::dtype_name(r.dtype()) +
                                   tg::shape_str(r.shape()) + ", the generator expected " +
                                   tg::dtype_name(n.dtype) + tg::shape_str(n.shape));
        }
    }
    Built b;
    for (int o : g.outputs) {
        b.names.push_back(var(o));
        b.tensors.push_back(t[size_t(o)]);
    }
    if (g.grad_mode == GradMode::NONE) return b;
    std::vector<int> leaves = grad_leaves(g);
    Tensor loss = loss_of(g, t);
    b.names.push_back("loss");
    b.tensors.push_back(loss);
    std::vector<Tensor> leaf_tensors;
    for (int l : leaves) leaf_tensors.push_back(t[size_t(l)]);
    std::vector<Tensor> grads;
    if (g.grad_mode == GradMode::BACKWARD) {
        loss.backward();
        for (const Tensor& l : leaf_tensors) grads.push_back(l.grad());
    } else {
        grads = tg::gradients(loss, leaf_tensors);
    }
    for (size_t j = 0; j < leaves.size(); j++) {
        b.names.push_back(var(leaves[j]) + ".grad");
        b.tensors.push_back(grads[j]);
    }
    if (g.grad_mode != GradMode::SECOND_ORDER) return b;
    Tensor loss2;
    for (size_t j = 0; j < leaves.size(); j++) {
        Tensor term = (grads[j] * weights(second_seed(g, int(j)), grads[j].shape())).sum();
        loss2 = loss2.defined() ? loss2 + term : term;
    }
    if (!loss2.tracks_grad()) return b;   // the gradients are constants: nothing to differentiate
    std::vector<Tensor> second = tg::gradients(loss2, leaf_tensors);
    for (size_t j = 0; j < leaves.size(); j++) {
        b.names.push_back(var(leaves[j]) + ".grad2");
        b.tensors.push_back(second[j]);
    }
    return b;
}

// The graph as C++ that builds and realizes it (with this header included).
inline std::string listing(const Graph& g) {
    static const char* modes[] = {"none", "backward()", "tg::gradients", "second order"};
    std::string s = "// graph " + std::to_string(g.seed) + ": " + std::to_string(g.nodes.size()) +
                    " nodes, gradients: " + modes[int(g.grad_mode)] + "\n";
    for (size_t i = 0; i < g.nodes.size(); i++) {
        const Node& n = g.nodes[i];
        std::string text;
        apply_node(n, nullptr, &text);
        std::string line = "Tensor " + var(int(i)) + " = " + text + ";";
        if (line.size() < 60) line.resize(60, ' ');
        s += line + "  // " + tg::dtype_name(n.dtype) + tg::shape_str(n.shape) +
             (n.grid >= 0 ? " exact" : "") + "\n";
    }
    std::string targets;
    for (int o : g.outputs) targets += (targets.empty() ? "" : ", ") + var(o);
    if (g.grad_mode != GradMode::NONE) {
        std::vector<int> terms = loss_terms(g), leaves = grad_leaves(g);
        std::string loss, leaf_list;
        for (size_t k = 0; k < terms.size(); k++)
            loss += std::string(k ? "\n    + " : "") + "(" + var(terms[k]) + " * " +
                    weights_text(weight_seed(g, int(k)), g.nodes[size_t(terms[k])].shape) +
                    ").sum()";
        for (size_t j = 0; j < leaves.size(); j++) leaf_list += (j ? ", " : "") + var(leaves[j]);
        s += "Tensor loss = " + loss + ";\n";
        targets += ", loss";
        if (g.grad_mode == GradMode::BACKWARD) {
            s += "loss.backward();\n";
            std::vector<bool> r = reached(g);
            for (int l : leaves)   // the others' grad() stays undefined
                if (r[size_t(l)]) targets += ", " + var(l) + ".grad()";
        } else {
            s += "std::vector<Tensor> g = tg::gradients(loss, {" + leaf_list + "});\n";
            for (size_t j = 0; j < leaves.size(); j++) targets += ", g[" + std::to_string(j) + "]";
        }
        if (g.grad_mode == GradMode::SECOND_ORDER) {
            std::string loss2;
            for (size_t j = 0; j < leaves.size(); j++)
                loss2 += std::string(j ? "\n    + " : "") + "(g[" + std::to_string(j) + "] * " +
                         weights_text(second_seed(g, int(j)),
                                      g.nodes[size_t(leaves[j])].shape) + ").sum()";
            s += "Tensor loss2 = " + loss2 + ";\n";
            s += "std::vector<Tensor> g2 = loss2.tracks_grad() ? tg::gradients(loss2, {" +
                 leaf_list + "}) : g;   // else the gradients are constants\n";
            for (size_t j = 0; j < leaves.size(); j++)
                targets += ", g2[" + std::to_string(j) + "]";
        }
    }
    return s + "tg::realize({" + targets + "});\n";
}

// ---- running on both devices and comparing -------------------------------------------------

// OPTIMIZED_CPU runs on $TG_ORACLE_DEVICE when set (CUDA on a machine with a GPU).
enum class Mode { OPTIMIZED_CPU, REFERENCE_INTERP };
inline const char* optimized_device() {
    const char* d = std::getenv("TG_ORACLE_DEVICE");
    return d && *d ? d : "CPU";
}
inline const char* mode_name(Mode m) {
    return m == Mode::OPTIMIZED_CPU ? optimized_device() : "INTERP (TG_PASSES=none)";
}

// Environment variables set (or unset, with a null value) for a scope, and put back as they
// were when it ends (tinygrad reads them each time it builds a program or a buffer).
class EnvScope {
public:
    EnvScope() = default;
    ~EnvScope() {
        for (size_t i = saved_.size(); i-- > 0;) {
            const auto& [name, value] = saved_[i];
            if (value.first) setenv(name.c_str(), value.second.c_str(), 1);
            else unsetenv(name.c_str());
        }
    }
    EnvScope(const EnvScope&) = delete;
    EnvScope& operator=(const EnvScope&) = delete;
    void set(const char* name, const char* value) {
        const char* was = std::getenv(name);
        saved_.push_back({name, {was != nullptr, was ? was : ""}});
        if (value) setenv(name, value, 1);
        else unsetenv(name);
    }

private:
    std::vector<std::pair<std::string, std::pair<bool, std::string>>> saved_;
};

// TG_DEVICE and TG_PASSES for one mode. The optimized mode builds each program optimized at
// once (TG_QUICK_RUNS=0), as the oracle checks the code that runs in the long run, with the
// caller's TG_PASSES (all passes when unset: a list bisects a mismatch to a pass, or leaves out
// plan_memory so that AddressSanitizer sees each temporary as a buffer of its own).
class ModeScope {
public:
    explicit ModeScope(Mode mode) {
        bool optimized = mode == Mode::OPTIMIZED_CPU;
        env_.set("TG_DEVICE", optimized ? optimized_device() : "INTERP");
        if (optimized) env_.set("TG_QUICK_RUNS", "0");
        else env_.set("TG_PASSES", "none");
    }

private:
    EnvScope env_;
};

struct Entry {
    std::string name;
    bool defined = false;
    DType dtype = DType::FLOAT32;
    Shape shape;
    std::vector<double> values;   // integers exactly (they stay far below 2^53)
};
struct Outcome {
    std::vector<Entry> entries;
    std::string error;   // a build or run that threw: always a failure
};

inline std::vector<Entry> read(const Built& b) {
    std::vector<Entry> out;
    for (size_t i = 0; i < b.tensors.size(); i++) {
        Entry e;
        e.name = b.names[i];
        const Tensor& t = b.tensors[i];
        e.defined = t.defined();
        if (e.defined) {
            e.dtype = t.dtype();
            e.shape = t.shape();
            if (is_float(e.dtype)) {
                e.values = t.to_vector<double>();
            } else {
                std::vector<int64_t> ints = t.to_vector<int64_t>();
                e.values.assign(ints.begin(), ints.end());
            }
        }
        out.push_back(std::move(e));
    }
    return out;
}

// Builds every graph under mode and realizes them all in one program. When that throws, each
// graph runs alone, so the error lands on the graph that caused it.
inline std::vector<Outcome> run(const std::vector<const Graph*>& graphs, Mode mode) {
    ModeScope scope(mode);
    std::vector<Outcome> out(graphs.size());
    std::vector<Built> built(graphs.size());
    std::vector<Tensor> targets;
    for (size_t i = 0; i < graphs.size(); i++) {
        try {
            built[i] = build(*graphs[i]);
            for (const Tensor& t : built[i].tensors)
                if (t.defined()) targets.push_back(t);
        } catch (const std::exception& e) {
            out[i].error = std::string("building: ") + e.what();
        }
    }
    try {
        if (!targets.empty()) tg::realize(targets);
        for (size_t i = 0; i < graphs.size(); i++)
            if (out[i].error.empty()) out[i].entries = read(built[i]);
    } catch (const std::exception& e) {
        if (graphs.size() == 1) {
            out[0].error = std::string("running: ") + e.what();
            return out;
        }
        for (size_t i = 0; i < graphs.size(); i++) out[i] = run({graphs[i]}, mode)[0];
    }
    return out;
}

// Floats agree when |a - b| <= rel·|b| + abs·scale, scale the largest |b| of the tensor (at
// least 1): the devices round differently (the C compiler contracts a·b + c into one fused
// multiply-add, the interpreter rounds both), and a sum that cancels keeps the absolute error
// of its terms, not a relative error of its result. A wrong index or a dropped term moves an
// element by about the tensor's own magnitude, far above both terms.
struct Tolerance {
    double rel = 1e-4, abs = 3e-5;
};

inline std::string element_text(const Entry& e, size_t flat) {
    std::string idx;
    size_t rest = flat;
    std::vector<int64_t> coords(e.shape.size());
    for (size_t d = e.shape.size(); d-- > 0;) {
        coords[d] = int64_t(rest % size_t(e.shape[d]));
        rest /= size_t(e.shape[d]);
    }
    return "element " + std::to_string(flat) + " " + join_ints(coords);
}

// "" when the two outcomes agree, else what differs first. worst (if given) grows to the
// largest |a - b| / allowed seen, so a run can say how close it came to the tolerance.
inline std::string compare(const Outcome& got, const Outcome& want, const Tolerance& tol,
                           double* worst = nullptr) {
    if (!got.error.empty() || !want.error.empty())
        return std::string("an error: ") + mode_name(Mode::OPTIMIZED_CPU) + ": " +
               (got.error.empty() ? "ok" : got.error) + "; " + mode_name(Mode::REFERENCE_INTERP) +
               ": " + (want.error.empty() ? "ok" : want.error);
    if (got.entries.size() != want.entries.size())
        return "different result counts: " + std::to_string(got.entries.size()) + " vs " +
               std::to_string(want.entries.size());
    for (size_t i = 0; i < got.entries.size(); i++) {
        const Entry &a = got.entries[i], &b = want.entries[i];
        std::string head = b.name + " " + tg::dtype_name(b.dtype) + tg::shape_str(b.shape);
        if (a.defined != b.defined) return b.name + ": defined on one device only";
        if (!a.defined) continue;
        if (a.dtype != b.dtype || a.shape != b.shape || a.values.size() != b.values.size())
            return b.name + ": " + tg::dtype_name(a.dtype) + tg::shape_str(a.shape) + " vs " +
                   tg::dtype_name(b.dtype) + tg::shape_str(b.shape);
        double scale = 1;
        for (double v : b.values)
            if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < b.values.size(); k++) {
            double x = a.values[k], y = b.values[k];
            bool same;
            if (!is_float(b.dtype)) {
                same = x == y;
            } else if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y)) {
                same = (std::isnan(x) && std::isnan(y)) || x == y;
            } else {
                double allowed = tol.rel * std::fabs(y) + tol.abs * scale;
                double err = std::fabs(x - y);
                if (worst) *worst = std::max(*worst, err / allowed);
                same = err <= allowed;
            }
            if (!same && bad++ == 0) first = k;
        }
        if (bad) {
            char buf[160];
            std::snprintf(buf, sizeof buf, ": CPU %.9g vs INTERP %.9g (%zu of %zu elements differ)",
                          a.values[first], b.values[first], bad, b.values.size());
            return head + " at " + element_text(b, first) + buf;
        }
    }
    return "";
}

struct Failure {
    size_t index;       // into the batch
    std::string what;   // compare()'s text
};
struct Report {
    std::vector<Failure> failures;
    double worst = 0;         // the largest error as a fraction of the tolerance
    size_t worst_index = 0;   // and its graph
    int64_t values = 0;       // elements compared
};

// Runs a batch of graphs as one program per mode and compares them.
inline Report check(const std::vector<Graph>& graphs, const Tolerance& tol) {
    std::vector<const Graph*> ptrs;
    for (const Graph& g : graphs) ptrs.push_back(&g);
    std::vector<Outcome> cpu = run(ptrs, Mode::OPTIMIZED_CPU);
    std::vector<Outcome> ref = run(ptrs, Mode::REFERENCE_INTERP);
    Report r;
    for (size_t i = 0; i < graphs.size(); i++) {
        double worst = 0;   // of the graphs that pass: how close they came
        std::string what = compare(cpu[i], ref[i], tol, &worst);
        if (!what.empty()) r.failures.push_back({i, what});
        else if (worst > r.worst) r.worst = worst, r.worst_index = i;
        for (const Entry& e : ref[i].entries) r.values += int64_t(e.values.size());
    }
    return r;
}

// "" when two optimized outcomes are the same bits (every NaN the same), else the first
// entry that differs and where.
inline std::string same_bits(const Outcome& a, const Outcome& b) {
    if (a.error != b.error) return "an error on one run only: " + a.error + " | " + b.error;
    if (a.entries.size() != b.entries.size()) return "different result counts";
    for (size_t i = 0; i < a.entries.size(); i++) {
        const Entry &x = a.entries[i], &y = b.entries[i];
        if (x.defined != y.defined || x.values.size() != y.values.size())
            return y.name + ": defined or sized differently";
        for (size_t k = 0; k < x.values.size(); k++) {
            double u = x.values[k], v = y.values[k];
            if (std::memcmp(&u, &v, sizeof u) != 0 && !(std::isnan(u) && std::isnan(v))) {
                char buf[96];
                std::snprintf(buf, sizeof buf, ": %.17g vs %.17g", u, v);
                return y.name + " at " + element_text(y, k) + buf;
            }
        }
    }
    return "";
}

// Runs a batch of graphs optimized on TG_THREADS=1 and on `threads` threads, with every nest
// that can run in chunks on threads (TG_PARALLEL_MIN_WORK=1), and compares the bits: the
// chunks, not the threads, fix how work is split, so the count must change nothing.
inline std::vector<Failure> check_threads(const std::vector<Graph>& graphs, int threads) {
    std::vector<const Graph*> ptrs;
    for (const Graph& g : graphs) ptrs.push_back(&g);
    std::vector<Outcome> runs[2];
    for (int r = 0; r < 2; r++) {
        EnvScope env;
        env.set("TG_PARALLEL_MIN_WORK", "1");
        env.set("TG_THREADS", std::to_string(r ? threads : 1).c_str());
        runs[r] = run(ptrs, Mode::OPTIMIZED_CPU);
    }
    std::vector<Failure> out;
    for (size_t i = 0; i < graphs.size(); i++) {
        std::string what = same_bits(runs[1][i], runs[0][i]);
        if (!what.empty())
            out.push_back({i, std::to_string(threads) + " threads against 1: " + what});
    }
    return out;
}

inline std::string check_one(const Graph& g, const Tolerance& tol) {
    Outcome cpu = run({&g}, Mode::OPTIMIZED_CPU)[0];
    Outcome ref = run({&g}, Mode::REFERENCE_INTERP)[0];
    return compare(cpu, ref, tol);
}

// ---- the graph as a jitted training step -----------------------------------------------------

// A data leaf that does not require grad is an input of the step: new values at each call.
inline bool is_step_input(const Node& n) {
    return n.kind == Kind::LEAF && Leaf(n.op) == Leaf::DATA && !n.grad;
}

// `calls` training steps of g on the optimized device: each computes the loss (loss_of),
// backward() and an SGD step (learning rate 1/16) of the leaves that require grad, which are
// the parameters; the other data leaves get new values at each call (of their seed and the
// call). jitted: under tg::Jit (the first call traces, the others replay), else eagerly. The
// outcome: each call's loss ("loss0", ...), then each parameter after the last call.
inline Outcome train(const Graph& g, bool jitted, int calls) {
    ModeScope scope(Mode::OPTIMIZED_CPU);
    Outcome out;
    try {
        const std::vector<Tensor> none;
        std::vector<Tensor> params;
        Built after;
        for (size_t i = 0; i < g.nodes.size(); i++)
            if (g.nodes[i].kind == Kind::LEAF && g.nodes[i].grad) {
                params.push_back(apply_node(g.nodes[i], &none, nullptr));
                after.names.push_back(var(int(i)));
                after.tensors.push_back(params.back());
            }
        tg::optim::SGD sgd(params, 1.0 / 16);
        auto step = [&](const std::vector<Tensor>& inputs) {
            std::vector<Tensor> t;
            size_t next_input = 0, next_param = 0;
            for (const Node& n : g.nodes) {
                if (is_step_input(n)) t.push_back(inputs[next_input++]);
                else if (n.kind == Kind::LEAF && n.grad) t.push_back(params[next_param++]);
                else t.push_back(apply_node(n, &t, nullptr));
            }
            Tensor loss = loss_of(g, t);
            sgd.zero_grad();
            loss.backward();
            sgd.step();
            return loss;
        };
        tg::Jit jit(step);
        for (int c = 0; c < calls; c++) {
            std::vector<Tensor> inputs;
            for (const Node& n : g.nodes)
                if (is_step_input(n)) {
                    Node called = n;
                    called.data_seed = mix_seed(n.data_seed, 4000 + uint64_t(c));
                    inputs.push_back(apply_node(called, &none, nullptr));
                }
            tg::realize(inputs);
            Tensor loss = jitted ? jit(inputs) : step(inputs);
            out.entries.push_back({"loss" + std::to_string(c), true, loss.dtype(), {},
                                   {loss.item()}});
        }
        std::vector<Entry> values = read(after);
        out.entries.insert(out.entries.end(), values.begin(), values.end());
    } catch (const std::exception& e) {
        out.error = e.what();
    }
    return out;
}

// "" when training g under the jit gives the bits of training it eagerly (or g has no loss
// that a parameter reaches), else what differs.
inline std::string check_jit(const Graph& g, int calls = 3) {
    if (!loss_tracks(g)) return "";
    std::string what = same_bits(train(g, true, calls), train(g, false, calls));
    return what.empty() ? "" : "jitted and eager training differ: " + what;
}

// ---- shrinking a failing graph ----------------------------------------------------------------

// Keeps the nodes the outputs read, renumbered in order.
inline Graph prune(const Graph& g) {
    std::vector<bool> keep(g.nodes.size(), false);
    for (int o : g.outputs) keep[size_t(o)] = true;
    for (size_t i = g.nodes.size(); i-- > 0;)
        if (keep[i])
            for (int s : g.nodes[i].in) keep[size_t(s)] = true;
    Graph out = g;
    out.nodes.clear();
    std::vector<int> id(g.nodes.size(), -1);
    for (size_t i = 0; i < g.nodes.size(); i++) {
        if (!keep[i]) continue;
        Node n = g.nodes[i];
        for (int& s : n.in) s = id[size_t(s)];
        id[i] = int(out.nodes.size());
        out.nodes.push_back(n);
    }
    for (int& o : out.outputs) o = id[size_t(o)];
    compute_tracks(out);
    if (!loss_tracks(out)) out.grad_mode = GradMode::NONE;
    return out;
}

// Smaller graphs that might fail the same way: fewer gradients or outputs, a node replaced by a
// leaf of its values (so everything before it goes), a node skipped when an operand has its
// shape and dtype.
inline std::vector<Graph> shrink_candidates(const Graph& g) {
    std::vector<Graph> out;
    Graph live = prune(g);   // nodes no output reads are built but never run
    if (live.nodes.size() < g.nodes.size()) out.push_back(live);
    if (g.grad_mode != GradMode::NONE) {
        Graph c = g;
        c.grad_mode = GradMode::NONE;
        out.push_back(c);
        if (g.grad_mode != GradMode::BACKWARD) {
            c.grad_mode = g.grad_mode == GradMode::SECOND_ORDER ? GradMode::GRADIENTS
                                                                : GradMode::BACKWARD;
            out.push_back(c);
        }
    }
    for (size_t k = 0; g.outputs.size() > 1 && k < g.outputs.size(); k++) {
        Graph c = g;
        c.outputs.erase(c.outputs.begin() + long(k));
        out.push_back(prune(c));
    }
    for (size_t k = 0; k < g.outputs.size(); k++)   // an operand of an output as the output
        for (int s : g.nodes[size_t(g.outputs[k])].in) {
            Graph c = g;
            c.outputs[k] = s;
            out.push_back(prune(c));
        }
    for (size_t i = g.nodes.size(); i-- > 0;) {
        const Node& n = g.nodes[i];
        if (n.kind == Kind::LEAF) continue;
        Graph c = g;
        Node& l = c.nodes[i];
        l.kind = Kind::LEAF;
        l.op = int(Leaf::DATA);
        l.in.clear();
        l.data_seed = mix_seed(g.seed, 3000 + i);
        l.grad = n.tracks;
        if (!is_float(l.dtype) && l.dtype != DType::BOOL) l.grid = 0;
        out.push_back(prune(c));
    }
    for (size_t i = 0; i < g.nodes.size(); i++) {
        const Node& n = g.nodes[i];
        for (int s : n.in) {
            const Node& src = g.nodes[size_t(s)];
            if (src.shape != n.shape || src.dtype != n.dtype) continue;
            Graph c = g;
            for (Node& m : c.nodes)
                for (int& k : m.in)
                    if (k == int(i)) k = s;
            for (int& o : c.outputs)
                if (o == int(i)) o = s;
            out.push_back(prune(c));
            break;
        }
    }
    for (size_t i = 0; i < g.nodes.size(); i++)
        if (g.nodes[i].kind == Kind::LEAF && g.nodes[i].grad) {
            Graph c = g;
            c.nodes[i].grad = false;
            out.push_back(prune(c));
        }
    return out;
}

// Greedy: takes the first smaller graph that still fails, until none does or tries run out.
// fails is check_one != "" normally; tries bounds the compiles.
inline Graph minimize(Graph g, const std::function<bool(const Graph&)>& fails, int tries = 150) {
    bool progress = true;
    while (progress && tries > 0) {
        progress = false;
        for (const Graph& c : shrink_candidates(g)) {
            if (tries-- <= 0) break;
            if (fails(c)) {
                g = c;
                progress = true;
                break;
            }
        }
    }
    return g;
}

}  // namespace oracle
