// The interpreter (TG_DEVICE=INTERP) against the compiled C (TG_DEVICE=CPU).
//
// Random graphs: a fixed-seed xorshift builds random shapes (rank 0-4, sizes 1-6) and random
// expressions of depth 3-6 that mix elementwise ops, broadcasting, every movement op, reductions,
// matmul and cat. Realizing a tensor turns its node into a buffer, so each graph is built twice
// from the same seed (the builder draws shapes, data and ops from its own generator) and one copy
// is realized per device. Float results agree to 1e-5 relative, int32 results exactly.
// Hand-picked and random view compositions are checked against plain loops over a reference
// array; the last cases check INTERP without a C compiler, and determinism.
#include "harness.hpp"
#include <setjmp.h>
#include <signal.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

using tg::DType;
using tg::Shape;
using tg::Tensor;
using th::EnvGuard;

namespace {

using Pairs = std::vector<std::pair<int64_t, int64_t>>;


// ---- deterministic random numbers ----------------------------------------------------------

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {
        if (!s) s = 1;
        for (int i = 0; i < 4; i++) next();
    }
    uint64_t next() {                                   // xorshift64*
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        return s * 0x2545F4914F6CDD1Dull;
    }
    int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }   // inclusive
    double uniform(double lo, double hi) {
        return lo + (hi - lo) * double(next() >> 11) * (1.0 / 9007199254740992.0);
    }
    bool chance(double p) { return uniform(0, 1) < p; }
};

std::string S(const Shape& s) { return tg::shape_str(s); }
std::string S(int64_t v) { return std::to_string(v); }
std::string S(const std::vector<int>& v) {
    std::string out = "{";
    for (size_t i = 0; i < v.size(); i++) out += (i ? "," : "") + std::to_string(v[i]);
    return out + "}";
}
std::string S(const Pairs& p) {
    std::string out = "{";
    for (size_t i = 0; i < p.size(); i++)
        out += (i ? ",{" : "{") + std::to_string(p[i].first) + "," + std::to_string(p[i].second) + "}";
    return out + "}";
}
std::string F(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

int64_t numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

// ---- the random graph builder ----------------------------------------------------------------

struct G {
    Tensor t;
    std::string d;      // the expression, as C++-like text, for failure messages
    double bound;       // a bound on |value|, to keep magnitudes moderate
};

enum GenOp {
    UNARY, BINARY, SCALAR_BIN, WHERE, PERMUTE, TRANSPOSE, EXPAND, FLIP, PAD, SHRINK, SLICE,
    RESHAPE, FLATTEN, REDUCE, MATMUL, CAT, CONTIGUOUS, NUM_GEN_OPS
};

class Gen {
public:
    Gen(uint64_t seed, bool ints) : rng(seed), ints(ints) {}
    Shape random_shape(int min_rank, int max_rank) {
        Shape s(size_t(rng.range(min_rank, max_rank)));
        for (auto& d : s) d = rng.range(1, 6);
        return s;
    }
    G make(int depth, const Shape& s) {
        if (depth <= 0) return leaf(s);
        if (rng.chance(0.1)) {                           // share a node: graphs are DAGs
            std::vector<size_t> same;
            for (size_t i = 0; i < pool.size(); i++)
                if (pool[i].t.shape() == s) same.push_back(i);
            if (!same.empty()) return pool[same[size_t(rng.range(0, int(same.size()) - 1))]];
        }
        static const GenOp weighted[] = {
            UNARY, UNARY, BINARY, BINARY, BINARY, SCALAR_BIN, WHERE, WHERE, PERMUTE, PERMUTE,
            TRANSPOSE, EXPAND, EXPAND, FLIP, PAD, PAD, SHRINK, SLICE, SLICE, RESHAPE, RESHAPE,
            FLATTEN, REDUCE, REDUCE, REDUCE, MATMUL, MATMUL, CAT, CAT, CONTIGUOUS};
        const int n = int(sizeof weighted / sizeof weighted[0]);
        for (int tries = 0; tries < 30; tries++) {
            std::optional<G> g = apply(weighted[rng.range(0, n - 1)], depth, s);
            if (g) return keep(norm(*g));
        }
        return keep(norm(*apply(UNARY, depth, s)));
    }

private:
    Rng rng;
    bool ints;
    int nleaf = 0;
    std::vector<G> pool;

    G keep(const G& g) { pool.push_back(g); return g; }
    int sub(int depth) { return rng.range(0, depth - 1); }   // depth of a secondary operand

    // Keeps |values| moderate: float graphs rescale, int graphs clamp.
    G norm(G g) {
        if (ints && g.bound > 1000) {
            int c = rng.range(20, 60);
            g.t = g.t.minimum(c).maximum(-c);
            g.d = "(" + g.d + ").minimum(" + S(c) + ").maximum(" + S(-c) + ")";
            g.bound = c;
        } else if (!ints && g.bound > 10) {
            float k = float(4 / g.bound);
            g.t = g.t * k;
            g.d = "(" + g.d + ")*" + F(k) + "f";
            g.bound = 4;
        }
        return g;
    }

    G leaf(const Shape& s) {
        std::string name = "in" + std::to_string(nleaf++);
        int64_t n = numel(s);
        double p = rng.uniform(0, 1);
        if (ints) {
            if (p < 0.84) {
                std::vector<int32_t> v(static_cast<size_t>(n));
                for (auto& x : v) x = rng.range(-4, 4);
                return {Tensor::from_vector(v, s), name + "=int32" + S(s), 4};
            }
            if (p < 0.92)
                return {Tensor::arange(n).reshape(s) - 3, "(arange(" + S(n) + ").reshape(" + S(s) + ")-3)",
                        double(n + 3)};
            int c = rng.range(-3, 3);
            return {Tensor::full(s, c, DType::INT32), "full(" + S(s) + "," + S(c) + ",int32)", 3};
        }
        if (p < 0.70) {
            std::vector<float> v(static_cast<size_t>(n));
            for (auto& x : v) x = float(rng.uniform(-2, 2));
            return {Tensor::from_vector(v, s), name + "=float" + S(s), 2};
        }
        if (p < 0.84) {
            std::vector<int32_t> v(static_cast<size_t>(n));
            for (auto& x : v) x = rng.range(-4, 4);
            return {Tensor::from_vector(v, s), name + "=int32" + S(s), 4};
        }
        if (p < 0.90) {
            uint64_t seed = uint64_t(rng.range(0, 1000));
            return {Tensor::rand(s, seed), "rand(" + S(s) + "," + S(int64_t(seed)) + ")", 1};
        }
        if (p < 0.95) {
            float c = float(rng.range(-8, 8)) * 0.25f;
            return {Tensor::full(s, c), "full(" + S(s) + "," + F(c) + ")", std::fabs(c)};
        }
        return {Tensor::arange(n).reshape(s) * 0.25f, "(arange(" + S(n) + ").reshape(" + S(s) + ")*0.25f)",
                double(n) * 0.25};
    }

    // A shape that broadcasts to s: a suffix of s with some sizes set to 1.
    Shape bcast_src(const Shape& s) {
        size_t r = s.size();
        if (r > 0 && rng.chance(0.4)) r = size_t(rng.range(0, int(s.size())));
        Shape out(s.end() - long(r), s.end());
        for (auto& d : out)
            if (rng.chance(0.3)) d = 1;
        return out;
    }

    std::optional<G> apply(GenOp op, int depth, const Shape& s) {
        const int rank = int(s.size());
        switch (op) {
        case UNARY: {
            G x = make(depth - 1, s);
            int k = rng.range(0, ints ? 2 : 7);
            if (ints) k = k == 0 ? 0 : k + 2;                // neg, relu, abs
            switch (k) {
            case 0: return G{-x.t, "-(" + x.d + ")", x.bound};
            case 1: {
                if (x.bound > 3) {
                    float c = float(3 / x.bound);
                    return G{(x.t * c).exp(), "((" + x.d + ")*" + F(c) + "f).exp()", std::exp(3.0)};
                }
                return G{x.t.exp(), "(" + x.d + ").exp()", std::exp(x.bound)};
            }
            case 2: return G{x.t.sin(), "(" + x.d + ").sin()", 1};
            case 3: return G{x.t.relu(), "(" + x.d + ").relu()", x.bound};
            case 4: return G{x.t.abs(), "(" + x.d + ").abs()", x.bound};
            case 5: return G{x.t.sigmoid(), "(" + x.d + ").sigmoid()", 1};
            case 6: return G{x.t.tanh(), "(" + x.d + ").tanh()", 1};
            default: return G{x.t.cos(), "(" + x.d + ").cos()", 1};
            }
        }
        case BINARY: {
            G a = make(depth - 1, s), b = make(sub(depth), bcast_src(s));
            if (rng.chance(0.5)) std::swap(a, b);
            int k = rng.range(0, ints ? 4 : 5);
            switch (k) {
            case 0: return G{a.t + b.t, "(" + a.d + ")+(" + b.d + ")", a.bound + b.bound};
            case 1: return G{a.t - b.t, "(" + a.d + ")-(" + b.d + ")", a.bound + b.bound};
            case 2: return G{a.t * b.t, "(" + a.d + ")*(" + b.d + ")", a.bound * b.bound};
            case 3: return G{a.t.maximum(b.t), "(" + a.d + ").maximum(" + b.d + ")", std::max(a.bound, b.bound)};
            case 4: return G{a.t.minimum(b.t), "(" + a.d + ").minimum(" + b.d + ")", std::max(a.bound, b.bound)};
            default:   // the denominator stays away from 0
                return G{a.t / (b.t.abs() + 0.5f), "(" + a.d + ")/((" + b.d + ").abs()+0.5f)", 2 * a.bound};
            }
        }
        case SCALAR_BIN: {
            G x = make(depth - 1, s);
            if (ints) {
                int c = rng.range(-3, 3);
                switch (rng.range(0, 3)) {
                case 0: return G{x.t + c, "(" + x.d + ")+" + S(c), x.bound + 3};
                case 1: return G{c - x.t, S(c) + "-(" + x.d + ")", x.bound + 3};
                case 2: return G{x.t * c, "(" + x.d + ")*" + S(c), x.bound * 3};
                default: return G{x.t.maximum(c), "(" + x.d + ").maximum(" + S(c) + ")", x.bound + 3};
                }
            }
            float c = float(rng.range(1, 12)) * (rng.chance(0.5) ? 0.25f : -0.25f);
            switch (rng.range(0, 4)) {
            case 0: return G{x.t + c, "(" + x.d + ")+" + F(c) + "f", x.bound + 3};
            case 1: return G{c - x.t, F(c) + "f-(" + x.d + ")", x.bound + 3};
            case 2: return G{x.t * c, "(" + x.d + ")*" + F(c) + "f", x.bound * 3};
            case 3: return G{x.t / c, "(" + x.d + ")/" + F(c) + "f", x.bound * 4};
            default: return G{x.t.maximum(c), "(" + x.d + ").maximum(" + F(c) + "f)", x.bound + 3};
            }
        }
        case WHERE: {
            G x = make(depth - 1, s), y = make(sub(depth), bcast_src(s));
            G p = make(sub(depth), bcast_src(s));
            Tensor cond;
            std::string cd;
            bool scalar_rhs = rng.chance(0.3);
            G q = scalar_rhs ? G{Tensor(), "", 0} : make(sub(depth), bcast_src(s));
            float c = float(rng.range(-4, 4)) * 0.5f + (ints ? 0.0f : 0.125f);
            int k = rng.range(0, ints ? 5 : 3);
            const char* names[] = {"<", ">", "<=", ">=", "==", "!="};
            if (scalar_rhs) {
                switch (k) {
                case 0: cond = p.t < c; break;
                case 1: cond = p.t > c; break;
                case 2: cond = p.t <= c; break;
                case 3: cond = p.t >= c; break;
                case 4: cond = p.t == int(c); break;
                default: cond = p.t != int(c); break;
                }
                cd = "(" + p.d + ")" + names[k] + (k >= 4 ? S(int(c)) : F(c));
            } else {
                switch (k) {
                case 0: cond = p.t < q.t; break;
                case 1: cond = p.t > q.t; break;
                case 2: cond = p.t <= q.t; break;
                case 3: cond = p.t >= q.t; break;
                case 4: cond = p.t == q.t; break;
                default: cond = p.t != q.t; break;
                }
                cd = "(" + p.d + ")" + names[k] + "(" + q.d + ")";
            }
            double bound = std::max(x.bound, y.bound);
            int form = rng.range(0, 3);
            if (form == 0)
                return G{tg::where(cond, x.t, y.t), "where(" + cd + "," + x.d + "," + y.d + ")", bound};
            if (form == 1)
                return G{tg::where(cond, y.t, x.t), "where(" + cd + "," + y.d + "," + x.d + ")", bound};
            if (ints) {
                int v = rng.range(-3, 3);
                return G{tg::where(cond, x.t, v), "where(" + cd + "," + x.d + "," + S(v) + ")", std::max(x.bound, 3.0)};
            }
            float v = float(rng.range(-6, 6)) * 0.5f;
            if (form == 2)
                return G{tg::where(cond, x.t, v), "where(" + cd + "," + x.d + "," + F(v) + "f)", std::max(x.bound, 3.0)};
            return G{tg::where(cond, v, x.t), "where(" + cd + "," + F(v) + "f," + x.d + ")", std::max(x.bound, 3.0)};
        }
        case PERMUTE: {
            if (rank < 2) return std::nullopt;
            std::vector<int> p(static_cast<size_t>(rank));
            for (int i = 0; i < rank; i++) p[size_t(i)] = i;
            for (int i = rank - 1; i > 0; i--) std::swap(p[size_t(i)], p[size_t(rng.range(0, i))]);
            Shape inner(static_cast<size_t>(rank));
            for (int i = 0; i < rank; i++) inner[size_t(p[size_t(i)])] = s[size_t(i)];
            G x = make(depth - 1, inner);
            std::vector<int> arg = p;
            if (rng.chance(0.3)) arg[0] -= rank;                  // negative axes are accepted
            return G{x.t.permute(arg), "(" + x.d + ").permute(" + S(arg) + ")", x.bound};
        }
        case TRANSPOSE: {
            if (rank < 2) return std::nullopt;
            int a0 = rng.range(0, rank - 1), a1 = rng.range(0, rank - 1);
            if (a0 == a1) return std::nullopt;
            Shape inner = s;
            std::swap(inner[size_t(a0)], inner[size_t(a1)]);
            G x = make(depth - 1, inner);
            if (rng.chance(0.5)) { a0 -= rank; }
            return G{x.t.transpose(a0, a1), "(" + x.d + ").transpose(" + S(a0) + "," + S(a1) + ")", x.bound};
        }
        case EXPAND: {
            Shape src = bcast_src(s);
            if (src == s) return std::nullopt;
            G x = make(depth - 1, src);
            Shape target = s;
            size_t lead = s.size() - src.size();
            for (size_t i = lead; i < s.size(); i++)
                if (src[i - lead] == s[i] && rng.chance(0.3)) target[i] = -1;
            return G{x.t.expand(target), "(" + x.d + ").expand(" + S(target) + ")", x.bound};
        }
        case FLIP: {
            if (rank < 1) return std::nullopt;
            std::vector<int> axes;
            for (int i = 0; i < rank; i++)
                if (rng.chance(0.5)) axes.push_back(rng.chance(0.3) ? i - rank : i);
            if (axes.empty()) axes.push_back(rng.range(0, rank - 1));
            G x = make(depth - 1, s);
            if (axes.size() == 1 && rng.chance(0.5))
                return G{x.t.flip(axes[0]), "(" + x.d + ").flip(" + S(axes[0]) + ")", x.bound};
            return G{x.t.flip(axes), "(" + x.d + ").flip(" + S(axes) + ")", x.bound};
        }
        case PAD: {
            Pairs p(size_t(rank), {0, 0});
            Shape inner = s;
            bool any = false;
            for (int i = 0; i < rank; i++) {
                if (s[size_t(i)] < 2 || rng.chance(0.3)) continue;
                int total = rng.range(1, int(s[size_t(i)]) - 1);
                int before = rng.range(0, total);
                p[size_t(i)] = {before, total - before};
                inner[size_t(i)] -= total;
                any = true;
            }
            if (!any) return std::nullopt;
            G x = make(depth - 1, inner);
            if (rng.chance(0.5))
                return G{x.t.pad(p), "(" + x.d + ").pad(" + S(p) + ")", x.bound};
            if (ints) {
                static const int values[] = {-3, 1, 5};
                int v = values[rng.range(0, 2)];
                return G{x.t.pad(p, v), "(" + x.d + ").pad(" + S(p) + "," + S(v) + ")", std::max(x.bound, 5.0)};
            }
            static const float values[] = {-1.5f, 0.25f, 2.0f};
            float v = values[rng.range(0, 2)];
            return G{x.t.pad(p, v), "(" + x.d + ").pad(" + S(p) + "," + F(v) + "f)", std::max(x.bound, 2.0)};
        }
        case SHRINK: {
            if (rank < 1) return std::nullopt;
            Pairs p(static_cast<size_t>(rank));
            Shape inner = s;
            for (int i = 0; i < rank; i++) {
                int b = rng.chance(0.6) ? rng.range(0, 2) : 0, a = rng.chance(0.6) ? rng.range(0, 2) : 0;
                inner[size_t(i)] = s[size_t(i)] + b + a;
                p[size_t(i)] = {b, b + s[size_t(i)]};
            }
            G x = make(depth - 1, inner);
            return G{x.t.shrink(p), "(" + x.d + ").shrink(" + S(p) + ")", x.bound};
        }
        case SLICE: {
            if (rank < 1) return std::nullopt;
            int ax = rng.range(0, rank - 1);
            int step = rng.chance(0.7) ? 2 : 3;
            int64_t count = s[size_t(ax)];
            int64_t b = rng.range(0, 2);
            int64_t len = rng.range(int((count - 1) * step + 1), int(count * step));
            int64_t e = b + len, n = e + rng.range(0, 2);
            Shape inner = s;
            inner[size_t(ax)] = n;
            G x = make(depth - 1, inner);
            int64_t start = (b > 0 && rng.chance(0.25)) ? b - n : b;
            int64_t end = (e < n && rng.chance(0.25)) ? e - n : e;
            int axis = rng.chance(0.3) ? ax - rank : ax;
            return G{x.t.slice(axis, start, end, step),
                     "(" + x.d + ").slice(" + S(axis) + "," + S(start) + "," + S(end) + "," + S(step) + ")", x.bound};
        }
        case RESHAPE: {
            // another shape of the same size: distribute the prime factors over 1-4 axes
            int64_t n = numel(s);
            int r = rng.range(1, 4);
            Shape inner(size_t(r), 1);
            int64_t m = n;
            for (int64_t f = 2; m > 1; f++)
                while (m % f == 0) { inner[size_t(rng.range(0, r - 1))] *= f; m /= f; }
            if (inner == s) return std::nullopt;
            G x = make(depth - 1, inner);
            Shape arg = s;
            if (rank > 0 && rng.chance(0.3)) arg[size_t(rng.range(0, rank - 1))] = -1;
            if (rng.chance(0.2))
                return G{x.t.view(arg), "(" + x.d + ").view(" + S(arg) + ")", x.bound};
            return G{x.t.reshape(arg), "(" + x.d + ").reshape(" + S(arg) + ")", x.bound};
        }
        case FLATTEN: {
            if (rank < 1 || rank > 3) return std::nullopt;
            int ax = rng.range(0, rank - 1);
            int64_t d = s[size_t(ax)];
            std::vector<int64_t> divisors;
            for (int64_t f = 1; f <= d; f++)
                if (d % f == 0) divisors.push_back(f);
            int64_t f1 = divisors[size_t(rng.range(0, int(divisors.size()) - 1))];
            Shape inner = s;
            inner[size_t(ax)] = f1;
            inner.insert(inner.begin() + ax + 1, d / f1);
            G x = make(depth - 1, inner);
            int end = rng.chance(0.5) ? ax + 1 : ax + 1 - (rank + 1);
            return G{x.t.flatten(ax, end), "(" + x.d + ").flatten(" + S(ax) + "," + S(end) + ")", x.bound};
        }
        case REDUCE: {
            int kind = rng.range(0, 2);               // sum, max, mean (ints: sum, max, min)
            const char* names[] = {"sum", "max", ints ? "min" : "mean"};
            auto red = [&](const Tensor& t, const std::vector<int>& axes, bool keep) {
                if (kind == 0) return t.sum(axes, keep);
                if (kind == 1) return t.max(axes, keep);
                return ints ? t.min(axes, keep) : t.mean(axes, keep);
            };
            auto red1 = [&](const Tensor& t, int axis, bool keep) -> Tensor {
                if (kind == 0) return t.sum(axis, keep);
                if (kind == 1) return t.max(axis, keep);
                return ints ? t.min(axis, keep) : t.mean(axis, keep);
            };
            if (rank == 0) {                          // everything
                Shape inner = random_shape(1, 3);
                G x = make(depth - 1, inner);
                Tensor t = kind == 0 ? x.t.sum() : kind == 1 ? x.t.max() : ints ? x.t.min() : x.t.mean();
                double bound = kind == 0 ? x.bound * double(numel(inner)) : x.bound;
                return G{t, "(" + x.d + ")." + names[kind] + "()", bound};
            }
            bool keep = rank == 4 || rng.chance(0.4);
            Shape inner = s;
            std::vector<int> axes;
            if (keep) {
                for (int i = 0; i < rank; i++)
                    if (s[size_t(i)] == 1 && rng.chance(0.7)) {
                        inner[size_t(i)] = rng.range(2, 6);
                        axes.push_back(rng.chance(0.3) ? i - rank : i);
                    }
                if (axes.empty()) return std::nullopt;
            } else {
                int k = rng.range(1, 4 - rank);
                for (int j = 0; j < k; j++) {
                    int pos = rng.range(0, int(inner.size()));
                    inner.insert(inner.begin() + pos, rng.range(1, 6));
                    for (int& a : axes)
                        if (a >= pos) a++;
                    axes.push_back(pos);
                }
            }
            G x = make(depth - 1, inner);
            int64_t count = 1;
            for (int a : axes) count *= inner[size_t(a < 0 ? a + int(inner.size()) : a)];
            double bound = kind == 0 ? x.bound * double(count) : x.bound;
            std::string k_str = keep ? ",true" : ",false";
            if (axes.size() == 1 && rng.chance(0.5))
                return G{red1(x.t, axes[0], keep), "(" + x.d + ")." + names[kind] + "(" + S(axes[0]) + k_str + ")", bound};
            return G{red(x.t, axes, keep), "(" + x.d + ")." + names[kind] + "(" + S(axes) + k_str + ")", bound};
        }
        case MATMUL: {
            int64_t k = rng.range(1, 6);
            Shape sa, sb;
            if (rank == 0) { sa = {k}; sb = {k}; }
            else if (rank == 1 && rng.chance(0.5)) { sa = {k}; sb = {k, s[0]}; }
            else if (rank == 1) { sa = {s[0], k}; sb = {k}; }
            else {
                Shape batch(s.begin(), s.end() - 2), bb = batch;
                size_t r = bb.empty() ? 0 : size_t(rng.range(0, int(bb.size())));
                bb.erase(bb.begin(), bb.begin() + long(bb.size() - r));
                for (auto& d : bb)
                    if (rng.chance(0.3)) d = 1;
                sa = batch; sb = bb;
                if (rng.chance(0.5)) std::swap(sa, sb);
                sa.insert(sa.end(), {s[size_t(rank - 2)], k});
                sb.insert(sb.end(), {k, s[size_t(rank - 1)]});
            }
            G a = make(depth - 1, sa), b = make(sub(depth), sb);
            return G{a.t.matmul(b.t), "(" + a.d + ").matmul(" + b.d + ")", a.bound * b.bound * double(k)};
        }
        case CAT: {
            std::vector<int> ok;
            for (int i = 0; i < rank; i++)
                if (s[size_t(i)] >= 2) ok.push_back(i);
            if (ok.empty()) return std::nullopt;
            int ax = ok[size_t(rng.range(0, int(ok.size()) - 1))];
            int64_t n = s[size_t(ax)];
            std::vector<int64_t> sizes;
            int64_t first = rng.range(1, int(n) - 1);
            sizes.push_back(first);
            if (n - first >= 2 && rng.chance(0.4)) {
                int64_t second = rng.range(1, int(n - first) - 1);
                sizes.push_back(second);
                sizes.push_back(n - first - second);
            } else {
                sizes.push_back(n - first);
            }
            std::vector<Tensor> parts;
            std::string d = "cat({";
            double bound = 0;
            for (size_t i = 0; i < sizes.size(); i++) {
                Shape ps = s;
                ps[size_t(ax)] = sizes[i];
                G x = make(i == 0 ? depth - 1 : sub(depth), ps);
                parts.push_back(x.t);
                d += (i ? "," : "") + x.d;
                bound = std::max(bound, x.bound);
            }
            int axis = rng.chance(0.3) ? ax - rank : ax;
            return G{tg::cat(parts, axis), d + "}," + S(axis) + ")", bound};
        }
        case CONTIGUOUS: {
            G x = make(depth - 1, s);
            return G{x.t.contiguous(), "(" + x.d + ").contiguous()", x.bound};
        }
        case NUM_GEN_OPS: break;
        }
        return std::nullopt;
    }
};

// ---- running on a device and comparing ------------------------------------------------------

struct Outcome {
    Shape shape;
    DType dtype = DType::FLOAT32;
    std::vector<double> v;
    std::string error;
};

// A crash inside a realize (a compiled program that divides by zero, say) becomes an error
// message for that case instead of ending the whole test run.
sigjmp_buf* crash_jump = nullptr;
void on_crash(int sig) {
    if (crash_jump) siglongjmp(*crash_jump, sig);
    signal(sig, SIG_DFL);
    raise(sig);
}
std::string run_guarded(const std::function<void()>& f) {
    static const int sigs[] = {SIGFPE, SIGILL, SIGSEGV, SIGBUS};
    struct sigaction sa, old[4];
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, &old[i]);
    sigjmp_buf jump;
    sigjmp_buf* outer = crash_jump;
    std::string error;
    int sig = sigsetjmp(jump, 1);
    if (sig == 0) {
        crash_jump = &jump;
        try {
            f();
        } catch (const std::exception& e) {
            error = e.what();
        }
    } else {
        error = std::string("crashed with signal ") + strsignal(sig);
    }
    crash_jump = outer;
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], nullptr);
    return error;
}

// Builds the tensors with TG_DEVICE=device, realizes them together and reads output `which`.
Outcome run_on(const char* device, const std::function<std::vector<Tensor>()>& build, size_t which = 0) {
    EnvGuard env("TG_DEVICE", device);
    Outcome o;
    o.error = run_guarded([&] {
        std::vector<Tensor> ts = build();
        if (ts.size() > 1) tg::realize(ts);
        const Tensor& t = ts[which];
        o.shape = t.shape();
        o.dtype = t.dtype();
        o.v = t.to_vector<double>();
    });
    return o;
}

// Empty when they agree, else what differs.
std::string compare(const Outcome& cpu, const Outcome& interp, double tol) {
    if (!cpu.error.empty() || !interp.error.empty())
        return "error: CPU '" + cpu.error + "' INTERP '" + interp.error + "'";
    if (cpu.shape != interp.shape) return "shapes " + S(cpu.shape) + " (CPU) vs " + S(interp.shape) + " (INTERP)";
    if (cpu.dtype != interp.dtype)
        return std::string("dtypes ") + tg::dtype_name(cpu.dtype) + " vs " + tg::dtype_name(interp.dtype);
    if (cpu.v.size() != interp.v.size() || int64_t(cpu.v.size()) != numel(cpu.shape))
        return "sizes " + S(int64_t(cpu.v.size())) + " vs " + S(int64_t(interp.v.size())) + " for shape " + S(cpu.shape);
    bool exact = !tg::dtype_is_float(cpu.dtype);
    for (size_t i = 0; i < cpu.v.size(); i++) {
        bool same = exact ? cpu.v[i] == interp.v[i] : th::near(cpu.v[i], interp.v[i], tol);
        if (!same) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "at flat index %zu of %s %s: CPU %.9g vs INTERP %.9g", i,
                          tg::dtype_name(cpu.dtype), S(cpu.shape).c_str(), cpu.v[i], interp.v[i]);
            return buf;
        }
    }
    return "";
}

// Builds graph `seed` twice, realizes it on each device and compares.
void random_graph_case(uint64_t seed, bool ints, int line) {
    Rng pick(seed ^ 0xABCDEFull);
    int depth = pick.range(3, 6);
    Shape shape;
    std::string desc;
    auto build = [&]() -> std::vector<Tensor> {
        Gen g(seed, ints);
        Shape s = g.random_shape(1, 4);
        if (seed % 11 == 0) s = {};                          // now and then a scalar result
        G out = g.make(depth, s);
        shape = s;
        desc = out.d;
        return {out.t};
    };
    Outcome cpu = run_on("CPU", build), interp = run_on("INTERP", build);
    std::string why = compare(cpu, interp, 1e-5);
    if (why.empty() && interp.shape != shape) why = "shape " + S(interp.shape) + ", expected " + S(shape);
    if (!why.empty())
        th::report(__FILE__, line, std::string(ints ? "int" : "float") + " graph seed " + S(int64_t(seed)) +
                                       " depth " + S(depth) + ": " + why + "\n      expr: " + desc);
}

// ---- a reference array for view compositions --------------------------------------------------

struct Ref {
    Shape shape;
    std::vector<double> v;
};

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
    std::vector<int64_t> idx(s.size());
    for (size_t d = s.size(); d-- > 0;) {
        idx[d] = flat % s[d];
        flat /= s[d];
    }
    return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
    int64_t flat = 0;
    for (size_t d = 0; d < s.size(); d++) flat = flat * s[d] + idx[d];
    return flat;
}
// out[idx] = f(idx), f returning the source's multi-index or nothing (a pad value)
Ref remap(const Ref& x, const Shape& out_shape,
          const std::function<bool(const std::vector<int64_t>&, std::vector<int64_t>&)>& f, double fill = 0) {
    Ref out{out_shape, std::vector<double>(size_t(numel(out_shape)))};
    for (int64_t i = 0; i < numel(out_shape); i++) {
        std::vector<int64_t> src;
        out.v[size_t(i)] = f(unravel(i, out_shape), src) ? x.v[size_t(ravel(src, x.shape))] : fill;
    }
    return out;
}
Ref r_reshape(const Ref& x, const Shape& s) { return Ref{s, x.v}; }
Ref r_permute(const Ref& x, const std::vector<int>& p) {
    Shape s;
    for (int a : p) s.push_back(x.shape[size_t(a)]);
    return remap(x, s, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src.assign(p.size(), 0);
        for (size_t d = 0; d < p.size(); d++) src[size_t(p[d])] = i[d];
        return true;
    });
}
Ref r_transpose(const Ref& x, int a0, int a1) {
    std::vector<int> p;
    for (int i = 0; i < int(x.shape.size()); i++) p.push_back(i);
    std::swap(p[size_t(a0)], p[size_t(a1)]);
    return r_permute(x, p);
}
Ref r_pad(const Ref& x, const Pairs& p, double value = 0) {
    Shape s = x.shape;
    for (size_t d = 0; d < s.size(); d++) s[d] += p[d].first + p[d].second;
    return remap(x, s, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src = i;
        for (size_t d = 0; d < s.size(); d++) {
            src[d] -= p[d].first;
            if (src[d] < 0 || src[d] >= x.shape[d]) return false;
        }
        return true;
    }, value);
}
Ref r_shrink(const Ref& x, const Pairs& p) {
    Shape s;
    for (auto& be : p) s.push_back(be.second - be.first);
    return remap(x, s, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src = i;
        for (size_t d = 0; d < s.size(); d++) src[d] += p[d].first;
        return true;
    });
}
Ref r_flip(const Ref& x, const std::vector<int>& axes) {
    return remap(x, x.shape, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src = i;
        for (int a : axes) src[size_t(a)] = x.shape[size_t(a)] - 1 - i[size_t(a)];
        return true;
    });
}
Ref r_expand(const Ref& x, const Shape& s) {                 // same rank; size-1 axes broadcast
    return remap(x, s, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src = i;
        for (size_t d = 0; d < s.size(); d++)
            if (x.shape[d] == 1) src[d] = 0;
        return true;
    });
}
Ref r_slice(const Ref& x, int ax, int64_t b, int64_t e, int64_t step) {
    Shape s = x.shape;
    s[size_t(ax)] = (e - b + step - 1) / step;
    return remap(x, s, [&](const std::vector<int64_t>& i, std::vector<int64_t>& src) {
        src = i;
        src[size_t(ax)] = b + i[size_t(ax)] * step;
        return true;
    });
}
Ref r_sum(const Ref& x, int ax) {                             // keepdim
    Shape s = x.shape;
    s[size_t(ax)] = 1;
    Ref out{s, std::vector<double>(size_t(numel(s)), 0.0)};
    for (int64_t i = 0; i < numel(x.shape); i++) {
        std::vector<int64_t> idx = unravel(i, x.shape);
        idx[size_t(ax)] = 0;
        out.v[size_t(ravel(idx, s))] += x.v[size_t(i)];
    }
    return out;
}

// Input data: distinct small integers (exact in float32), so a misplaced element is visible.
std::vector<float> iota_data(const Shape& s, float scale = 1.0f, float offset = 1.0f) {
    std::vector<float> v(size_t(numel(s)));
    for (size_t i = 0; i < v.size(); i++) v[i] = float(i) * scale + offset;
    return v;
}

// Realizes view(x) on both devices and checks it against ref(x) exactly.
void check_view(const char* what, const Shape& in_shape, const std::function<Tensor(const Tensor&)>& view,
                const std::function<Ref(const Ref&)>& ref, int line) {
    std::vector<float> data = iota_data(in_shape);
    Ref want = ref(Ref{in_shape, std::vector<double>(data.begin(), data.end())});
    for (const char* dev : {"CPU", "INTERP"}) {
        Outcome o = run_on(dev, [&] { return std::vector<Tensor>{view(Tensor::from_vector(data, in_shape))}; });
        std::string why;
        if (!o.error.empty()) why = "error: " + o.error;
        else if (o.shape != want.shape) why = "shape " + S(o.shape) + ", expected " + S(want.shape);
        else if (o.v.size() != want.v.size()) why = "size " + S(int64_t(o.v.size()));
        else
            for (size_t i = 0; i < o.v.size() && why.empty(); i++)
                if (o.v[i] != want.v[i])
                    why = "at flat index " + S(int64_t(i)) + ": got " + F(o.v[i]) + ", expected " + F(want.v[i]);
        if (!why.empty()) th::report(__FILE__, line, std::string(what) + " on " + dev + ": " + why);
    }
}

}  // namespace

// ---- CPU vs INTERP on random graphs ---------------------------------------------------------

TEST(interp_random_float_graphs) {
    for (uint64_t seed = 1; seed <= 64; seed++) random_graph_case(seed, false, __LINE__);
}

TEST(interp_random_int32_graphs) {
    for (uint64_t seed = 1001; seed <= 1024; seed++) random_graph_case(seed, true, __LINE__);
}

// Two outputs of one program (tg::realize) that share part of their graph.
TEST(interp_random_graphs_two_outputs) {
    for (uint64_t seed = 2001; seed <= 2006; seed++) {
        std::string desc;
        auto build = [&]() -> std::vector<Tensor> {
            Gen g(seed, seed % 2 == 0);
            Shape s = g.random_shape(2, 3);
            G a = g.make(3, s);
            G b = g.make(1, s);
            Tensor shared = (a.t + b.t).contiguous();
            Tensor out0 = shared.sum(0), out1 = shared.flip(0).max(-1, true) + b.t;
            desc = "shared=((" + a.d + ")+(" + b.d + ")).contiguous(); {shared.sum(0), shared.flip(0).max(-1,true)+b}";
            return {out0, out1};
        };
        for (size_t which = 0; which < 2; which++) {
            Outcome cpu = run_on("CPU", build, which), interp = run_on("INTERP", build, which);
            std::string why = compare(cpu, interp, 1e-5);
            if (!why.empty())
                th::report(__FILE__, __LINE__, "seed " + S(int64_t(seed)) + " output " + S(int64_t(which)) + ": " +
                                                   why + "\n      expr: " + desc);
        }
    }
}

// ---- view compositions against loops -----------------------------------------------------------

TEST(interp_views_permute_reshape) {
    check_view("x[3,4].permute({1,0}).reshape({2,6})", {3, 4},
               [](const Tensor& x) { return x.permute({1, 0}).reshape({2, 6}); },
               [](const Ref& x) { return r_reshape(r_permute(x, {1, 0}), {2, 6}); }, __LINE__);
    check_view("x[3,4].permute({1,0}).reshape({12})", {3, 4},
               [](const Tensor& x) { return x.permute({1, 0}).reshape({12}); },
               [](const Ref& x) { return r_reshape(r_permute(x, {1, 0}), {12}); }, __LINE__);
    // a reshape that no single set of strides can express
    check_view("x[2,3,4].permute({2,0,1}).reshape({8,3})", {2, 3, 4},
               [](const Tensor& x) { return x.permute({2, 0, 1}).reshape({8, 3}); },
               [](const Ref& x) { return r_reshape(r_permute(x, {2, 0, 1}), {8, 3}); }, __LINE__);
    check_view("x[2,3,4].permute({2,0,1}).reshape({3,8})", {2, 3, 4},
               [](const Tensor& x) { return x.permute({2, 0, 1}).reshape({3, 8}); },
               [](const Ref& x) { return r_reshape(r_permute(x, {2, 0, 1}), {3, 8}); }, __LINE__);
    check_view("x[4,6].transpose().reshape({3,2,4})", {4, 6},
               [](const Tensor& x) { return x.transpose().reshape({3, 2, 4}); },
               [](const Ref& x) { return r_reshape(r_transpose(x, 0, 1), {3, 2, 4}); }, __LINE__);
    check_view("x[2,3,4].permute({1,2,0}).reshape({4,6}).permute({1,0})", {2, 3, 4},
               [](const Tensor& x) { return x.permute({1, 2, 0}).reshape({4, 6}).permute({1, 0}); },
               [](const Ref& x) { return r_permute(r_reshape(r_permute(x, {1, 2, 0}), {4, 6}), {1, 0}); }, __LINE__);
}

TEST(interp_views_pad_flip_shrink) {
    check_view("x[3,4].pad({{1,2},{0,1}}).flip({0,1}).shrink({{1,5},{2,4}})", {3, 4},
               [](const Tensor& x) { return x.pad({{1, 2}, {0, 1}}).flip({0, 1}).shrink({{1, 5}, {2, 4}}); },
               [](const Ref& x) { return r_shrink(r_flip(r_pad(x, {{1, 2}, {0, 1}}), {0, 1}), {{1, 5}, {2, 4}}); },
               __LINE__);
    check_view("x[3,4].pad({{2,1},{1,1}}, 7.5f).flip(1).shrink({{0,4},{1,6}})", {3, 4},
               [](const Tensor& x) { return x.pad({{2, 1}, {1, 1}}, 7.5f).flip(1).shrink({{0, 4}, {1, 6}}); },
               [](const Ref& x) { return r_shrink(r_flip(r_pad(x, {{2, 1}, {1, 1}}, 7.5), {1}), {{0, 4}, {1, 6}}); },
               __LINE__);
    check_view("x[2,5].shrink({{0,2},{1,4}}).pad({{1,0},{2,2}}, -1).flip(0)", {2, 5},
               [](const Tensor& x) { return x.shrink({{0, 2}, {1, 4}}).pad({{1, 0}, {2, 2}}, -1).flip(0); },
               [](const Ref& x) { return r_flip(r_pad(r_shrink(x, {{0, 2}, {1, 4}}), {{1, 0}, {2, 2}}, -1), {0}); },
               __LINE__);
    // pad of a pad, the inner one with a value
    check_view("x[3].pad({{1,1}}, 2).pad({{2,0}})", {3},
               [](const Tensor& x) { return x.pad({{1, 1}}, 2).pad({{2, 0}}); },
               [](const Ref& x) { return r_pad(r_pad(x, {{1, 1}}, 2), {{2, 0}}); }, __LINE__);
}

TEST(interp_views_transpose_contiguous_reshape) {
    check_view("x[3,4].transpose().contiguous().reshape({2,2,3})", {3, 4},
               [](const Tensor& x) { return x.transpose().contiguous().reshape({2, 2, 3}); },
               [](const Ref& x) { return r_reshape(r_transpose(x, 0, 1), {2, 2, 3}); }, __LINE__);
    check_view("x[2,3,4].transpose(0,2).contiguous().flip(1).reshape({-1})", {2, 3, 4},
               [](const Tensor& x) { return x.transpose(0, 2).contiguous().flip(1).reshape({-1}); },
               [](const Ref& x) { return r_reshape(r_flip(r_transpose(x, 0, 2), {1}), {24}); }, __LINE__);
}

TEST(interp_views_slice_step_of_permuted) {
    check_view("x[4,5].permute({1,0}).slice(0,1,5,2)", {4, 5},
               [](const Tensor& x) { return x.permute({1, 0}).slice(0, 1, 5, 2); },
               [](const Ref& x) { return r_slice(r_permute(x, {1, 0}), 0, 1, 5, 2); }, __LINE__);
    check_view("x[4,5].permute({1,0}).slice(1,0,4,3)", {4, 5},
               [](const Tensor& x) { return x.permute({1, 0}).slice(1, 0, 4, 3); },
               [](const Ref& x) { return r_slice(r_permute(x, {1, 0}), 1, 0, 4, 3); }, __LINE__);
    check_view("x[3,4,5].permute({2,0,1}).slice(0,0,5,2).slice(2,1,4,2)", {3, 4, 5},
               [](const Tensor& x) { return x.permute({2, 0, 1}).slice(0, 0, 5, 2).slice(2, 1, 4, 2); },
               [](const Ref& x) { return r_slice(r_slice(r_permute(x, {2, 0, 1}), 0, 0, 5, 2), 2, 1, 4, 2); },
               __LINE__);
    check_view("x[6,2].flip(0).slice(0,-5,-1,2)", {6, 2},
               [](const Tensor& x) { return x.flip(0).slice(0, -5, -1, 2); },
               [](const Ref& x) { return r_slice(r_flip(x, {0}), 0, 1, 5, 2); }, __LINE__);
}

TEST(interp_views_expand_of_reshaped) {
    check_view("x[6].reshape({2,1,3}).expand({2,4,3})", {6},
               [](const Tensor& x) { return x.reshape({2, 1, 3}).expand({2, 4, 3}); },
               [](const Ref& x) { return r_expand(r_reshape(x, {2, 1, 3}), {2, 4, 3}); }, __LINE__);
    check_view("x[2,3].permute({1,0}).reshape({3,1,2}).expand({3,2,2}).reshape({6,2})", {2, 3},
               [](const Tensor& x) { return x.permute({1, 0}).reshape({3, 1, 2}).expand({3, 2, 2}).reshape({6, 2}); },
               [](const Ref& x) {
                   return r_reshape(r_expand(r_reshape(r_permute(x, {1, 0}), {3, 1, 2}), {3, 2, 2}), {6, 2});
               },
               __LINE__);
    check_view("x[3].reshape({3,1}).expand({3,4}).permute({1,0}).flip(1)", {3},
               [](const Tensor& x) { return x.reshape({3, 1}).expand({3, 4}).permute({1, 0}).flip(1); },
               [](const Ref& x) { return r_flip(r_permute(r_expand(r_reshape(x, {3, 1}), {3, 4}), {1, 0}), {1}); },
               __LINE__);
    // expand, then a reshape that merges the broadcast axis with a real one
    check_view("x[2,3].reshape({2,1,3}).expand({2,2,3}).reshape({4,3}).shrink({{1,4},{0,3}})", {2, 3},
               [](const Tensor& x) { return x.reshape({2, 1, 3}).expand({2, 2, 3}).reshape({4, 3}).shrink({{1, 4}, {0, 3}}); },
               [](const Ref& x) {
                   return r_shrink(r_reshape(r_expand(r_reshape(x, {2, 1, 3}), {2, 2, 3}), {4, 3}), {{1, 4}, {0, 3}});
               },
               __LINE__);
}

TEST(interp_views_reduce_of_views) {
    check_view("x[2,3,4].permute({2,0,1}).reshape({4,6}).sum(1,true)", {2, 3, 4},
               [](const Tensor& x) { return x.permute({2, 0, 1}).reshape({4, 6}).sum(1, true); },
               [](const Ref& x) { return r_sum(r_reshape(r_permute(x, {2, 0, 1}), {4, 6}), 1); }, __LINE__);
    check_view("x[3,4].pad({{1,1},{0,2}},3).flip(0).sum(0,true)", {3, 4},
               [](const Tensor& x) { return x.pad({{1, 1}, {0, 2}}, 3).flip(0).sum(0, true); },
               [](const Ref& x) { return r_sum(r_flip(r_pad(x, {{1, 1}, {0, 2}}, 3), {0}), 0); }, __LINE__);
}

// where(cond, a, b) over 2-D and 3-D loop nests against a loop, both devices, exactly: the C
// reads `a` and `b` under the condition (a pad may guard an out-of-range load), and these nests
// are what a vectorizing C compiler turns into masked loads.
TEST(interp_where_select_against_loops) {
    auto data = [](int64_t n, uint64_t seed) {
        Rng r(seed);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = float(r.range(-4, 4));
        return v;
    };
    for (const Shape& s : {Shape{6, 6}, Shape{15, 1, 5}, Shape{4, 6, 10}, Shape{36}}) {
        int64_t n = numel(s);
        std::vector<float> c = data(n, 2), w = data(n, 1), u = data(n, 3);
        std::vector<double> want_const(static_cast<size_t>(n)), want_abs(static_cast<size_t>(n));
        for (size_t i = 0; i < size_t(n); i++) {
            want_const[i] = c[i] < -0.875f ? w[i] : -1.5;
            want_abs[i] = c[i] < -1.0f ? w[i] : std::fabs(u[i]);
        }
        auto check = [&](const char* what, const std::function<Tensor()>& f, const std::vector<double>& want) {
            for (const char* dev : {"CPU", "INTERP"}) {
                Outcome o = run_on(dev, [&] { return std::vector<Tensor>{f()}; });
                std::string why = !o.error.empty() ? "error: " + o.error
                                  : o.shape != s ? "shape " + S(o.shape) : "";
                for (size_t i = 0; why.empty() && i < o.v.size(); i++)
                    if (o.v[i] != want[i])
                        why = "at " + S(int64_t(i)) + ": got " + F(o.v[i]) + ", expected " + F(want[i]);
                if (!why.empty()) th::report(__FILE__, __LINE__, std::string(dev) + " " + S(s) + " " + what + ": " + why);
            }
        };
        check("where(c < -0.875f, w, -1.5f)", [&] {
            return tg::where(Tensor::from_vector(c, s) < -0.875f, Tensor::from_vector(w, s), -1.5f);
        }, want_const);
        check("where(c < -1.0f, w, u.abs().contiguous())", [&] {
            return tg::where(Tensor::from_vector(c, s) < -1.0f, Tensor::from_vector(w, s),
                             Tensor::from_vector(u, s).abs().contiguous());
        }, want_abs);
    }
}

// Random chains of 3-6 movement ops against the reference, exactly, on both devices.
TEST(interp_random_view_chains) {
    for (uint64_t seed = 1; seed <= 24; seed++) {
        Rng rng(seed + 500);
        Shape in;
        for (int r = rng.range(1, 3), i = 0; i < r; i++) in.push_back(rng.range(1, 5));
        std::vector<std::function<Tensor(const Tensor&)>> ops;
        std::vector<std::function<Ref(const Ref&)>> refs;
        std::string desc = "x" + S(in);
        Shape s = in;
        int n = rng.range(3, 6);
        for (int step = 0; step < n; step++) {
            int rank = int(s.size());
            int k = rng.range(0, 7);
            if (k == 0 && rank >= 2) {
                std::vector<int> p(static_cast<size_t>(rank));
                for (int i = 0; i < rank; i++) p[size_t(i)] = i;
                for (int i = rank - 1; i > 0; i--) std::swap(p[size_t(i)], p[size_t(rng.range(0, i))]);
                ops.push_back([p](const Tensor& x) { return x.permute(p); });
                refs.push_back([p](const Ref& x) { return r_permute(x, p); });
                desc += ".permute(" + S(p) + ")";
                Shape t;
                for (int a : p) t.push_back(s[size_t(a)]);
                s = t;
            } else if (k == 1) {
                int64_t m = numel(s);
                int r = rng.range(1, 4);
                Shape t(size_t(r), 1);
                for (int64_t f = 2; m > 1; f++)
                    while (m % f == 0) { t[size_t(rng.range(0, r - 1))] *= f; m /= f; }
                ops.push_back([t](const Tensor& x) { return x.reshape(t); });
                refs.push_back([t](const Ref& x) { return r_reshape(x, t); });
                desc += ".reshape(" + S(t) + ")";
                s = t;
            } else if (k == 2) {
                Pairs p;
                double value = rng.chance(0.5) ? 0 : double(rng.range(-9, -1));
                for (int i = 0; i < rank; i++) p.push_back({rng.range(0, 2), rng.range(0, 2)});
                ops.push_back([p, value](const Tensor& x) { return x.pad(p, value); });
                refs.push_back([p, value](const Ref& x) { return r_pad(x, p, value); });
                desc += ".pad(" + S(p) + "," + F(value) + ")";
                for (int i = 0; i < rank; i++) s[size_t(i)] += p[size_t(i)].first + p[size_t(i)].second;
            } else if (k == 3) {
                Pairs p;
                for (int i = 0; i < rank; i++) {
                    int64_t b = rng.range(0, int(s[size_t(i)]) - 1);
                    int64_t e = rng.range(int(b) + 1, int(s[size_t(i)]));
                    p.push_back({b, e});
                }
                ops.push_back([p](const Tensor& x) { return x.shrink(p); });
                refs.push_back([p](const Ref& x) { return r_shrink(x, p); });
                desc += ".shrink(" + S(p) + ")";
                for (int i = 0; i < rank; i++) s[size_t(i)] = p[size_t(i)].second - p[size_t(i)].first;
            } else if (k == 4) {
                std::vector<int> axes;
                for (int i = 0; i < rank; i++)
                    if (rng.chance(0.5)) axes.push_back(i);
                if (axes.empty()) axes.push_back(0);
                ops.push_back([axes](const Tensor& x) { return x.flip(axes); });
                refs.push_back([axes](const Ref& x) { return r_flip(x, axes); });
                desc += ".flip(" + S(axes) + ")";
            } else if (k == 5) {
                int ax = rng.range(0, rank - 1), st = rng.range(2, 3);
                int64_t b = rng.range(0, int(s[size_t(ax)]) - 1);
                int64_t e = rng.range(int(b) + 1, int(s[size_t(ax)]));
                ops.push_back([=](const Tensor& x) { return x.slice(ax, b, e, st); });
                refs.push_back([=](const Ref& x) { return r_slice(x, ax, b, e, st); });
                desc += ".slice(" + S(ax) + "," + S(b) + "," + S(e) + "," + S(st) + ")";
                s[size_t(ax)] = (e - b + st - 1) / st;
            } else if (k == 6 && rank < 4) {
                int pos = rng.range(0, rank);
                int64_t size = rng.range(2, 3);
                Shape with1 = s, t = s;
                with1.insert(with1.begin() + pos, 1);
                t.insert(t.begin() + pos, size);
                ops.push_back([with1, t](const Tensor& x) { return x.reshape(with1).expand(t); });
                refs.push_back([with1, t](const Ref& x) { return r_expand(r_reshape(x, with1), t); });
                desc += ".reshape(" + S(with1) + ").expand(" + S(t) + ")";
                s = t;
            } else {
                ops.push_back([](const Tensor& x) { return x.contiguous(); });
                refs.push_back([](const Ref& x) { return x; });
                desc += ".contiguous()";
            }
        }
        check_view(desc.c_str(), in,
                   [&](const Tensor& x) { Tensor t = x; for (auto& f : ops) t = f(t); return t; },
                   [&](const Ref& x) { Ref r = x; for (auto& f : refs) r = f(r); return r; }, __LINE__);
    }
}

// ---- INTERP needs no compiler ----------------------------------------------------------------

TEST(interp_runs_without_a_compiler) {
    EnvGuard cc("TG_CC", "/nonexistent/cc");
    EnvGuard dev("TG_DEVICE", "INTERP");
    int64_t compiles = tg::stats().compiles;
    // an expression no other case builds (so no compiled program could be reused)
    Tensor x = Tensor::from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 0.5f, -1.0f, 4.75f}, {2, 3});
    Tensor y = (x.permute({1, 0}) * 0.3125f + 0.0625f).relu().sum(1);
    std::vector<float> v = y.to_vector();
    // x^T = [[1.5,0.5],[-2.25,-1],[3,4.75]] → ·0.3125+0.0625, relu, row sums
    std::vector<double> want = {(1.5 * 0.3125 + 0.0625) + (0.5 * 0.3125 + 0.0625), 0.0,
                                (3.0 * 0.3125 + 0.0625) + (4.75 * 0.3125 + 0.0625)};
    CHECK_ALL_NEAR(v, want, 1e-6);
    Tensor z = Tensor::arange(7).reshape({7, 1}).expand({7, 2}).flip(0) * 3;
    std::vector<int32_t> zi = z.to_vector<int32_t>();
    CHECK_EQ(zi.size(), size_t(14));
    for (size_t i = 0; i < zi.size() && i < 14; i++) CHECK_EQ(zi[i], int32_t(3 * (6 - int(i / 2))));
    CHECK_EQ(tg::stats().compiles, compiles);
    // the same compiler setting on CPU fails to compile a new program, naming the compiler
    // (x stays on INTERP, where it was made: its copy on the CPU computes there)
    Tensor w = (x.to("CPU") * 0.171875f).exp().sum();
    CHECK_THROWS(w.realize(), "/nonexistent/cc");
    CHECK_EQ(tg::stats().compiles, compiles);
}

// ---- determinism -----------------------------------------------------------------------------------

// Bit-for-bit equality of two outcomes (same shape, same values, NaNs included).
bool identical(const Outcome& a, const Outcome& b) {
    return a.error.empty() && b.error.empty() && a.shape == b.shape && a.v.size() == b.v.size() &&
           std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(double)) == 0;
}

TEST(interp_cpu_realize_is_deterministic) {
    auto graph = [] { return std::vector<Tensor>{Gen(77, false).make(5, {3, 4, 2}).t}; };
    Outcome a = run_on("CPU", graph), b = run_on("CPU", graph);
    CHECK_EQ(a.error, std::string());
    CHECK_EQ(a.v.size(), size_t(24));
    CHECK(identical(a, b));
    // and a matmul with a fused reduction, twice
    auto mm = [] {
        Tensor p = Tensor::from_vector(iota_data({5, 7}, 0.37f, -6.0f), {5, 7});
        Tensor q = Tensor::from_vector(iota_data({7, 3}, -0.21f, 2.5f), {7, 3});
        return std::vector<Tensor>{(p.matmul(q).sigmoid() + p.sum(1, true)).mean(0)};
    };
    Outcome c = run_on("CPU", mm), d = run_on("CPU", mm);
    CHECK_EQ(c.v.size(), size_t(3));
    CHECK(identical(c, d));
}

TEST(interp_rand_same_on_every_device) {
    std::vector<std::function<Tensor()>> cases = {
        [] { return Tensor::rand({4, 5}, 42); },
        [] { return Tensor::rand({3, 2, 7}, 0); },
        [] { return Tensor::rand({1000}, 123456789012345ull); },
        [] { return Tensor::rand({6, 4}, 9).permute({1, 0}).flip(0).slice(1, 1, 6, 2); },
    };
    for (size_t i = 0; i < cases.size(); i++) {
        auto build = [&] { return std::vector<Tensor>{cases[i]()}; };
        Outcome c = run_on("CPU", build), it = run_on("INTERP", build);
        CHECK(!c.v.empty());
        CHECK(identical(c, it));
        for (double v : c.v) CHECK(v >= 0.0 && v < 1.0);
    }
    // the same seed twice gives the same values; another seed others
    auto r64 = [](uint64_t seed) { return [seed] { return std::vector<Tensor>{Tensor::rand({64}, seed)}; }; };
    Outcome a = run_on("CPU", r64(5)), b = run_on("INTERP", r64(5)), c = run_on("INTERP", r64(6));
    CHECK(identical(a, b));
    CHECK(a.v != c.v);
    // randn is built from rand with libm functions: close on both devices
    auto randn = [] { return std::vector<Tensor>{Tensor::randn({8, 8}, 3)}; };
    Outcome n1 = run_on("CPU", randn), n2 = run_on("INTERP", randn);
    CHECK_EQ(n1.v.size(), size_t(64));
    CHECK_ALL_NEAR(n1.v, n2.v, 1e-5);
}

// ---- patterns a C compiler has miscompiled ----------------------------------------------------

// A product stored by one kernel and multiplied as a matrix by the next, in float64: GCC 12.2 at
// -O3 with AVX-512, once both kernels were inlined into tg_program, let the second kernel's
// restrict pointer reorder its reads before the first kernel's stores (rows came out wrong).
TEST(interp_product_then_matmul_across_kernels) {
    auto build = [] {
        auto in = [](const Shape& s, uint64_t seed) {
            return Tensor::from_vector(th::randd(8, seed), s);
        };
        Tensor p = in({2, 4}, 61) * in({2, 4}, 62) * in({2, 4}, 63);   // read twice: stored
        return std::vector<Tensor>{p.matmul(in({4, 2}, 64)), p.sum()};
    };
    Outcome c = run_on("CPU", build), i = run_on("INTERP", build);
    CHECK_EQ(compare(c, i, 1e-12), std::string());
}

// A cat of a vector and two views of one random tensor, read by a product: the fused nest
// clamps each piece's index with selects (i < 4 ? 0 : i - 4, i < 406 ? 0 : i - 406), and GCC
// 12 at -O2 computed the third piece's index wrong from the conditional expression (found by
// the oracle); index selects are bit masks now.
TEST(interp_cat_pieces_with_clamped_indices) {
    auto build = [] {
        Tensor r = Tensor::rand({3, 7, 7, 4}, 63045u).reshape({588}).shrink({{186, 588}});
        Tensor head = Tensor::from_vector(std::vector<float>{0.5f, -1.25f, 1, 2});
        std::vector<double> values = th::randd(808 * 5, 71);
        Tensor w = Tensor::from_vector(std::vector<float>(values.begin(), values.end()), {808, 5});
        return std::vector<Tensor>{tg::cat({head, r, r}, -1).matmul(w)};
    };
    Outcome c = run_on("CPU", build), i = run_on("INTERP", build);
    CHECK_EQ(compare(c, i, 1e-5), std::string());
}

// A sum adds a product term as one fused multiply-add: with u = 1 + 2^-12, the product u·u =
// 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 alone, so -(1 + 2^-11) + u·u is 0 when multiplied and
// added apart and 2^-24 when fused. Each row of x·w is that sum, in loops, in tiles of a
// matrix product (on threads too) and in the interpreter.
TEST(interp_sums_of_products_use_fused_multiply_add) {
    const float u = 1 + std::ldexp(1.0f, -12), c = -(1 + std::ldexp(1.0f, -11));
    const float fused = std::fma(u, u, c);
    CHECK_EQ(double(fused), std::ldexp(1.0, -24));
    CHECK_EQ(c + u * u, 0.0f);
    const int64_t n = 48;   // x [n, 2] times w [2, n]: every entry is c·1 + u·u
    std::vector<float> x, w(size_t(2 * n));
    for (int64_t i = 0; i < n; i++) x.insert(x.end(), {c, u});
    for (int64_t j = 0; j < n; j++) w[size_t(j)] = 1, w[size_t(n + j)] = u;
    for (const char* min_work : {"1000000000", "1"})   // in loops, then in tiles
        for (const char* dev : {"CPU", "INTERP"}) {
            th::EnvGuard tile("TG_TILE_MIN_WORK", min_work);
            Outcome o = run_on(dev, [&] {
                Tensor a = Tensor::from_vector(x, {n, 2}), b = Tensor::from_vector(w, {2, n});
                return std::vector<Tensor>{a.matmul(b)};
            });
            CHECK_EQ(o.error, std::string());
            CHECK_EQ(o.v.size(), size_t(n * n));
            for (double v : o.v) CHECK_EQ(v, double(fused));
        }
}

// float64 → float32 → float64 in loops of 2, 3, 6, 7 and 19 elements and in [15,2] and [5,3]
// nests: GCC 12.2's SLP vectorizer turned the round trip into a plain copy (the float rounding
// was lost) in such short loops and in the tails of longer ones.
TEST(interp_float32_rounding_in_short_loops) {
    for (const Shape& s :
         {Shape{2}, Shape{3}, Shape{6}, Shape{7}, Shape{19}, Shape{15, 2}, Shape{5, 3}}) {
        int64_t n = numel(s);
        std::vector<double> v(static_cast<size_t>(n)), want(v.size());
        for (size_t i = 0; i < v.size(); i++) {
            v[i] = 0.1 + 1.6 * double(i);
            want[i] = double(float(v[i]));
        }
        for (const char* dev : {"CPU", "INTERP"}) {
            Outcome o = run_on(dev, [&] {
                Tensor x = Tensor::from_vector(v, s);
                return std::vector<Tensor>{x.cast(DType::FLOAT32).cast(DType::FLOAT64)};
            });
            CHECK(o.error.empty());
            CHECK_EQ(o.v, want);
        }
    }
}

// The mean of eye(5) divided by |eye(5)| + 0.5 is one nest: two loops sum the 25 elements (16
// and 9), then a loop nest compares i == j for each element. GCC 12.2 at -O3 with AVX-512VL
// vectorized that nest with masks of two 64-bit lanes and stored 0 for rows 1 to 3 (found by
// the oracle, graph 1851); the CPU device now compiles with -mno-avx512vl under GCC. The
// optimized build runs at once (a quick -O0 build computed it right). On a machine without
// AVX-512VL this checks the values only.
TEST(interp_compare_of_loop_indices_after_two_sums) {
    th::EnvGuard quick("TG_QUICK_RUNS", "0");
    for (const char* dev : {"CPU", "INTERP"}) {
        Outcome o = run_on(dev, [] {
            Tensor eye = Tensor::eye(5);
            return std::vector<Tensor>{eye.flatten().mean(0, true) / (eye.abs() + 0.5f)};
        });
        CHECK(o.error.empty());
        CHECK_EQ(o.v.size(), size_t(25));
        for (size_t k = 0; k < o.v.size(); k++)
            CHECK_NEAR(o.v[k], k / 5 == k % 5 ? 0.2 / 1.5 : 0.2 / 0.5, 1e-6);
    }
}

// GCC 12.2 at -O3 crashed in its vectorizer ("internal compiler error") on one nest: an argmax
// along rows, spread over a second loop by repeat(), plus a one-hot (found by the oracle, graph
// 5791). The CPU device builds such a program again at -O1. With another compiler this checks
// the values only.
TEST(interp_argmax_repeated_where_the_compiler_crashed) {
    th::EnvGuard quick("TG_QUICK_RUNS", "0");
    std::vector<float> v(210);
    for (size_t i = 0; i < v.size(); i++) v[i] = float(i * 37 % 17) / 4 - 2;
    std::vector<Outcome> outs;
    for (const char* dev : {"CPU", "INTERP"})
        outs.push_back(run_on(dev, [&] {
            Tensor rows = Tensor::from_vector(v, {7, 6, 5});
            Tensor id = Tensor::from_vector(std::vector<int32_t>{0}, {});
            return std::vector<Tensor>{rows.argmax(2, true).repeat({2, 1, 2}) +
                                       tg::nn::functional::one_hot(id, 1)};
        }));
    CHECK_EQ(outs[0].error, std::string());
    CHECK_EQ(outs[0].shape, (Shape{14, 6, 2}));
    CHECK_EQ(outs[0].v, outs[1].v);
}

// relu and its gradient fused into one loop are two selects on one condition: GCC 12 at -O3
// once computed 30 of 196 gradients wrong here (inner loops of 7 iterations) when the C
// said c ? a : b. Checked against a loop on every device.
TEST(interp_two_selects_on_one_condition_in_a_fused_loop) {
    Rng r(7);
    std::vector<float> x(196), w(196);
    for (auto& v : x) v = float(r.range(-2, 2));
    for (auto& v : w) v = float(r.range(-1, 1));
    for (const char* dev : {"CPU", "INTERP"}) {
        th::EnvGuard device("TG_DEVICE", dev);
        Tensor t = Tensor::from_vector(x, {7, 4, 7, 1}).requires_grad();
        Tensor relu = t.relu();
        (relu * Tensor::from_vector(w, {7, 4, 7, 1})).sum().backward();
        tg::realize({relu, t.grad()});
        std::vector<float> got = relu.to_vector(), grad = t.grad().to_vector();
        for (size_t i = 0; i < x.size(); i++) {
            CHECK_EQ(got[i], x[i] > 0 ? x[i] : 0.0f);
            CHECK_EQ(grad[i], x[i] > 0 ? w[i] : 0.0f);
        }
    }
}
