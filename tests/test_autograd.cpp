// Autograd: every differentiable op against central finite differences in float64, the
// PyTorch conventions at ties, second derivatives (Hessian-vector products through
// tg::gradients), and the semantics of backward / grad / zero_grad / detach / NoGrad.
//
// The gradient checker differentiates a scalar: f itself when it has one element, otherwise
// sum(f · W) with W a fixed random float64 tensor (so every output element is weighted
// differently and a wrong routing of the gradient shows). The analytic gradient comes from
// backward() into grad() (and from tg::gradients where asked); the numerical one is
// (L(x + h·e_i) - L(x - h·e_i)) / 2h with h = 1e-6. Checks run in batches (see GradCheck) so
// that the whole file compiles few programs.
#include "harness.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

using tg::DType;
using tg::Shape;
using tg::Tensor;

namespace {
using th::Lcg;
using th::randd;
using th::randf;
using th::randi;

using Vec = std::vector<double>;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// ---- helpers (deterministic inputs: th::randf/randd/randi) ---------------------------------
int64_t count(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

// One input of a checked function: its values (float64) and shape.
struct In {
    Vec data;
    Shape shape;
};
// random values in [lo, hi); away_from_zero (with 0 < lo) gives each a random sign: ±[lo, hi)
In rnd(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1, bool away_from_zero = false) {
    Vec v = randd(size_t(count(shape)), seed, lo, hi);
    if (away_from_zero) {
        Vec sign = randd(v.size(), seed + 1000);
        for (size_t i = 0; i < v.size(); i++)
            if (sign[i] < 0) v[i] = -v[i];
    }
    return {v, shape};
}
Tensor T(const In& in) { return Tensor::from_vector(in.data, in.shape); }
Tensor T(const Vec& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor I32(const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Vec vals(const Tensor& t) { return t.to_vector<double>(); }

// ---- the gradient checker -------------------------------------------------------------------

const double H = 1e-6;      // finite-difference step
const double TOL = 1e-6;    // relative + absolute tolerance of the comparison

// The scalar that is differentiated: f itself, or sum(f · W) for a fixed W of f's shape.
Tensor scalarize(const Tensor& y) {
    if (y.numel() == 1) return y.reshape({});
    Tensor w = T(randd(size_t(y.numel()), 977 + uint64_t(y.numel()), -1, 1), y.shape());
    return (y * w).sum();
}

using F1 = std::function<Tensor(const Tensor&)>;
using F2 = std::function<Tensor(const Tensor&, const Tensor&)>;

// A batch of gradient checks, run together: the analytic gradients of every function (by
// backward() into grad(), and by tg::gradients too when asked) in one program, then for each
// finite-difference point every function's loss in one program. Every point has the same graph
// structure over new input buffers, so a batch compiles two programs however many points it
// has. (Compiling is what costs: the two ways of asking for gradients share backward_rule, so
// most batches check backward() alone and autograd_gradients_agree_with_backward both.)
class GradCheck {
public:
    explicit GradCheck(bool also_gradients = false) : also_gradients_(also_gradients) {}
    void add(const char* what, Fn f, std::vector<In> ins, double tol = TOL,
             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
        Item it;
        it.what = what;
        it.f = std::move(f);
        it.ins = std::move(ins);
        it.tol = tol;
        it.file = file;
        it.line = line;
        items_.push_back(std::move(it));
    }
    void add1(const char* what, const F1& f, const In& x, double tol = TOL,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
        add(what, [f](const std::vector<Tensor>& v) { return f(v[0]); }, {x}, tol, file, line);
    }
    void add2(const char* what, const F2& f, const In& a, const In& b, double tol = TOL,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
        add(what, [f](const std::vector<Tensor>& v) { return f(v[0], v[1]); }, {a, b}, tol, file, line);
    }

    // collects the mismatches instead of reporting them (to test the checker itself)
    void collect_mismatches(std::vector<std::string>* into) { collect_ = into; }

    void run() {
        std::vector<Item*> live;
        std::vector<Tensor> targets;
        for (Item& it : items_) {
            try {
                analytic(it, targets);
                live.push_back(&it);
            } catch (const tg::Error& e) {
                fail(it, std::string("threw ") + e.what());
            }
        }
        tg::realize(targets);
        // numerical: point p moves element p (counting through the inputs in order) of every
        // function's inputs by ±H; functions with fewer elements are evaluated unmoved
        size_t points = 0;
        for (Item* it : live) points = std::max(points, it->numel());
        for (Item* it : live) it->numeric.assign(it->numel(), 0.0);
        for (size_t p = 0; p < points; p++) {
            Vec plus;
            for (double sign : {1.0, -1.0}) {
                std::vector<Tensor> losses;
                for (Item* it : live) losses.push_back(scalarize(it->f(it->inputs(p, sign * H))));
                tg::realize(losses);
                for (size_t j = 0; j < live.size(); j++) {
                    if (sign > 0) plus.push_back(losses[j].item());
                    else if (p < live[j]->numel())
                        live[j]->numeric[p] = (plus[j] - losses[j].item()) / (2 * H);
                }
            }
        }
        for (Item* it : live) compare(*it);
    }

private:
    struct Item {
        std::string what;
        Fn f;
        std::vector<In> ins;
        double tol = TOL;
        const char* file = nullptr;
        int line = 0;
        std::vector<Tensor> xs, lazy;   // the leaves and tg::gradients' results
        Vec numeric;                    // finite differences, inputs concatenated

        size_t numel() const {
            size_t n = 0;
            for (const In& in : ins) n += in.data.size();
            return n;
        }
        // the inputs as fresh tensors, with element p (counting through all inputs) moved by delta
        std::vector<Tensor> inputs(size_t p, double delta) const {
            std::vector<Tensor> out;
            for (const In& in : ins) {
                Vec d = in.data;
                if (p < d.size()) d[p] += delta;
                p = p < d.size() ? size_t(-1) : p - d.size();
                out.push_back(T(d, in.shape));
            }
            return out;
        }
    };
    std::vector<Item> items_;
    bool also_gradients_;
    std::vector<std::string>* collect_ = nullptr;

    void fail(const Item& it, const std::string& why) {
        if (collect_) collect_->push_back(it.what + ": " + why);
        else th::report(it.file, it.line, it.what + ": " + why);
    }

    void analytic(Item& it, std::vector<Tensor>& targets) {
        for (const In& in : it.ins) it.xs.push_back(T(in).requires_grad());
        Tensor out = it.f(it.xs);
        if (out.dtype() != DType::FLOAT64)
            fail(it, std::string("output is ") + tg::dtype_name(out.dtype()) + ", not float64");
        Tensor loss = scalarize(out);
        if (also_gradients_) it.lazy = tg::gradients(loss, it.xs);
        loss.backward();
        targets.insert(targets.end(), it.lazy.begin(), it.lazy.end());
        for (const Tensor& x : it.xs)
            if (x.grad().defined()) targets.push_back(x.grad());
    }

    void compare(const Item& it) {
        size_t offset = 0;
        for (size_t k = 0; k < it.ins.size(); offset += it.ins[k].data.size(), k++) {
            std::string which = "input " + std::to_string(k);
            const Tensor& x = it.xs[k];
            if (!x.grad().defined()) {
                fail(it, which + ": backward() left grad() undefined");
                continue;
            }
            if (x.grad().shape() != it.ins[k].shape) {
                fail(it, which + ": grad() has shape " + tg::shape_str(x.grad().shape()) +
                             ", the input " + tg::shape_str(it.ins[k].shape));
                continue;
            }
            if (also_gradients_ && it.lazy[k].shape() != it.ins[k].shape) {
                fail(it, which + ": tg::gradients gives shape " + tg::shape_str(it.lazy[k].shape()) +
                             ", the input has " + tg::shape_str(it.ins[k].shape));
                continue;
            }
            Vec g_backward = vals(x.grad()), g_lazy = also_gradients_ ? vals(it.lazy[k]) : g_backward;
            for (size_t i = 0; i < it.ins[k].data.size(); i++) {
                double numeric = it.numeric[offset + i];
                std::ostringstream os;
                os.precision(12);
                if (!th::near(g_backward[i], numeric, it.tol)) {
                    os << which << ", element " << i << ": backward() gives " << g_backward[i]
                       << ", finite differences " << numeric;
                    fail(it, os.str());
                    break;
                }
                if (!th::near(g_lazy[i], g_backward[i], 1e-12)) {
                    os << which << ", element " << i << ": tg::gradients gives " << g_lazy[i]
                       << ", backward() " << g_backward[i];
                    fail(it, os.str());
                    break;
                }
            }
        }
    }
};

}  // namespace

// ---- elementwise ------------------------------------------------------------------------------

TEST(autograd_binary_broadcast) {
    GradCheck gc;
    In a = rnd({2, 3}, 1), b = rnd({3}, 2), c = rnd({2, 1}, 3), d = rnd({1, 3}, 4);
    In pos = rnd({3}, 5, 0.5, 2, true);   // divisors away from zero
    gc.add2("add", [](const Tensor& x, const Tensor& y) { return x + y; }, a, b);
    gc.add2("sub", [](const Tensor& x, const Tensor& y) { return x - y; }, a, b);
    gc.add2("mul", [](const Tensor& x, const Tensor& y) { return x * y; }, a, b);
    gc.add2("div", [](const Tensor& x, const Tensor& y) { return x / y; }, a, pos);
    gc.add2("add [2,1]+[1,3]", [](const Tensor& x, const Tensor& y) { return x + y; }, c, d);
    gc.add2("mul [2,1]*[1,3]", [](const Tensor& x, const Tensor& y) { return x * y; }, c, d);
    gc.add2("sub [1,3]-[2,1]", [](const Tensor& x, const Tensor& y) { return x - y; }, d, c);
    gc.add2("div [2,1]/[1,3]", [](const Tensor& x, const Tensor& y) { return x / y; }, c,
            rnd({1, 3}, 6, 0.5, 2, true));
    gc.add2("same operand twice", [](const Tensor& x, const Tensor& y) { return x * x + y * x; }, a, a);
    gc.run();
}

// PyTorch's other names: their gradients are those of what they compose
TEST(autograd_mm_bmm_t_mT_square_clone) {
    GradCheck gc;
    In a = rnd({3, 4}, 41), b = rnd({4, 2}, 42), ba = rnd({2, 3, 4}, 43), bb = rnd({2, 4, 2}, 44);
    gc.add2("mm", [](const Tensor& x, const Tensor& y) { return x.mm(y); }, a, b);
    gc.add2("bmm", [](const Tensor& x, const Tensor& y) { return x.bmm(y); }, ba, bb);
    gc.add1("t", [](const Tensor& x) { return x.t() * 2.0; }, a);
    gc.add1("mT", [](const Tensor& x) { return x.mT() * 2.0; }, ba);
    gc.add1("square", [](const Tensor& x) { return x.square(); }, a);
    gc.add1("clone", [](const Tensor& x) { return x.clone() * x; }, a);
    // values away from the bounds (the gradient is 1 inside [min, max], 0 outside)
    gc.add1("clamp", [](const Tensor& x) { return x.clamp(-0.33, 0.41) * x; }, a);
    gc.add1("masked_fill", [](const Tensor& x) { return x.masked_fill(x > 0.2, 3.0) * x; }, a);
    gc.add1("var", [](const Tensor& x) { return x.var(1); }, a);
    gc.add1("std over all, correction 0", [](const Tensor& x) {
        return x.std(std::vector<int>{0, 1}, 0); }, a);
    gc.add1("repeat", [](const Tensor& x) { return x.repeat({2, 1, 3}) * 1.5; }, a);
    gc.add1("log1p", [](const Tensor& x) { return (x * 0.9).log1p(); }, a);   // |x| < 1
    gc.add1("log1p near 0", [](const Tensor& x) { return (x * 1e-4).log1p() * 1e4; }, a);
    gc.add1("expm1", [](const Tensor& x) { return (x * 2.0).expm1(); }, a);
    gc.add1("tan", [](const Tensor& x) { return (x * 0.7).tan(); }, a);   // |x| < π/2
    gc.add1("nan_to_num", [](const Tensor& x) { return (x * 2.0).nan_to_num(); }, a);
    gc.add1("split", [](const Tensor& x) {
        std::vector<Tensor> p = x.split({1, 3}, 1);
        return p[0] * p[1].sum(1, true); }, a);
    gc.run();
}

TEST(autograd_max_min_topk_cumsum_remainder_functional) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    In a = rnd({3, 5}, 51, -2, 2), b = rnd({3, 5}, 52, 0.7, 1.9, true), w = rnd({4, 5}, 53);
    In bias = rnd({4}, 54), long_row = rnd({300}, 55);
    gc.add1("max(1).values", [](const Tensor& x) { return x.max(1).values * 2.0; }, a);
    gc.add1("min(0, keepdim)", [](const Tensor& x) { return x.min(0, true) * x; }, a);
    gc.add1("topk(2)", [](const Tensor& x) { return x.topk(2, 1).values * 3.0; }, a);
    gc.add1("topk smallest", [](const Tensor& x) { return x.topk(3, 0, false).values; }, a);
    gc.add1("sort(1)", [](const Tensor& x) { return x.sort(1).values * x; }, a);
    gc.add1("sort(0, descending)", [](const Tensor& x) { return x.sort(0, true).values.tanh(); },
            a);
    gc.add1("cumsum(1)", [](const Tensor& x) { return x.cumsum(1) * x; }, a);
    gc.add1("cumsum(0)", [](const Tensor& x) { return x.cumsum(0).square(); }, a);
    gc.add1("cumprod(1)", [](const Tensor& x) { return x.cumprod(1); }, a);
    In zero_in_row = {{0.5, 0, -1.5, 2, 0.7, 1.1, 0, -0.8, 0, 1.3}, {2, 5}};
    gc.add1("cumprod(-1) through zeros", [](const Tensor& x) { return x.cumprod(-1) * x; },
            zero_in_row);
    gc.add1("cumsum of 300 (blocks)", [](const Tensor& x) { return x.cumsum(0) * x; },
            long_row);
    gc.add2("remainder", [](const Tensor& x, const Tensor& y) { return x % y; }, a, b);
    gc.add2("fmod", [](const Tensor& x, const Tensor& y) { return x.fmod(y); }, a, b);
    gc.add1("x % 0.9", [](const Tensor& x) { return x % 0.9; }, a);
    gc.add1("floor(x) * x", [](const Tensor& x) { return x.floor() * x + x.ceil(); }, a);
    gc.add2("F::linear", [&](const Tensor& x, const Tensor& y) { return F::linear(x, y); }, a, w);
    gc.add2("F::layer_norm", [](const Tensor& x, const Tensor& y) {
        return F::layer_norm(x, y, Tensor()); }, a, b);
    gc.add1("F::dropout (a fixed mask)", [](const Tensor& x) {
        return F::dropout(x, 0.3, true, 11) * x; }, a);
    gc.add1("linear bias", [&](const Tensor& c) {
        return F::linear(Tensor::ones({2, 5}), Tensor::ones({4, 5}), c); }, bias);
    gc.run();
}

TEST(autograd_scalar_operands) {
    GradCheck gc;
    In a = rnd({2, 3}, 7), pos = rnd({2, 3}, 8, 0.5, 2, true);
    gc.add1("x + 2", [](const Tensor& x) { return x + 2.0; }, a);
    gc.add1("2 - x", [](const Tensor& x) { return 2.0 - x; }, a);
    gc.add1("x - 0.5", [](const Tensor& x) { return x - 0.5; }, a);
    gc.add1("3 * x", [](const Tensor& x) { return 3.0 * x; }, a);
    gc.add1("x * 3 (int scalar)", [](const Tensor& x) { return x * 3; }, a);
    gc.add1("x / 4", [](const Tensor& x) { return x / 4.0; }, a);
    gc.add1("3 / x", [](const Tensor& x) { return 3.0 / x; }, pos);
    gc.add1("-x", [](const Tensor& x) { return -x; }, a);
    gc.run();
}

TEST(autograd_unary) {
    GradCheck gc;
    In a = rnd({2, 3}, 11, -2, 2), pos = rnd({2, 3}, 12, 0.3, 3), nz = rnd({2, 3}, 13, 0.3, 2, true);
    gc.add1("exp", [](const Tensor& x) { return x.exp(); }, a);
    gc.add1("log", [](const Tensor& x) { return x.log(); }, pos);
    gc.add1("exp2", [](const Tensor& x) { return x.exp2(); }, a);
    gc.add1("log2", [](const Tensor& x) { return x.log2(); }, pos);
    gc.add1("sqrt", [](const Tensor& x) { return x.sqrt(); }, pos);
    gc.add1("rsqrt", [](const Tensor& x) { return x.rsqrt(); }, pos);
    gc.add1("reciprocal", [](const Tensor& x) { return x.reciprocal(); }, nz);
    gc.add1("sin", [](const Tensor& x) { return x.sin(); }, a);
    gc.add1("cos", [](const Tensor& x) { return x.cos(); }, a);
    gc.add1("tanh", [](const Tensor& x) { return x.tanh(); }, a);
    gc.add1("sigmoid", [](const Tensor& x) { return x.sigmoid(); }, a);
    gc.add1("relu", [](const Tensor& x) { return x.relu(); }, nz);
    gc.add1("gelu (erf)", [](const Tensor& x) { return x.gelu(); }, nz);
    gc.add1("gelu (tanh approximation)", [](const Tensor& x) { return x.gelu(true); }, a);
    gc.add1("abs", [](const Tensor& x) { return x.abs(); }, nz);
    gc.add1("chain: sigmoid(exp(sin x)) * tanh x",
            [](const Tensor& x) { return x.sin().exp().sigmoid() * x.tanh(); }, a);
    gc.run();
}

TEST(autograd_pow) {
    GradCheck gc;
    In pos = rnd({2, 3}, 21, 0.3, 2), e = rnd({2, 3}, 22, -2, 2), nz = rnd({2, 3}, 23, 0.3, 2, true);
    gc.add2("pow(tensor, tensor)", [](const Tensor& x, const Tensor& y) { return x.pow(y); }, pos, e);
    gc.add2("pow broadcast [2,3]^[3]", [](const Tensor& x, const Tensor& y) { return x.pow(y); }, pos,
            rnd({3}, 24, -2, 2));
    // negative bases with integer exponents (the exponent is a constant here: the function
    // is NaN between the integers)
    Tensor ints = T({2, 3, -1, 0, 1, 4}, {2, 3});
    gc.add1("pow(negative base, integer tensor)", [ints](const Tensor& x) { return x.pow(ints); }, nz);
    gc.add1("pow(x, 3) (integer scalar)", [](const Tensor& x) { return x.pow(3); }, nz);
    gc.add1("pow(x, 2) (integer scalar)", [](const Tensor& x) { return x.pow(2); }, nz);
    gc.add1("pow(x, 0)", [](const Tensor& x) { return x.pow(0) * x; }, nz);
    gc.add1("pow(x, 2.5)", [](const Tensor& x) { return x.pow(2.5); }, pos);
    gc.add1("pow(x, 0.5)", [](const Tensor& x) { return x.pow(0.5); }, pos);
    gc.add1("pow(x, -1.5)", [](const Tensor& x) { return x.pow(-1.5); }, pos);
    gc.add1("pow(x, -2.0)", [](const Tensor& x) { return x.pow(-2.0); }, nz);
    gc.run();
}

TEST(autograd_maximum_minimum) {
    GradCheck gc;
    In a = rnd({2, 3}, 31), b = rnd({2, 3}, 32), r = rnd({3}, 33);
    gc.add2("maximum", [](const Tensor& x, const Tensor& y) { return x.maximum(y); }, a, b);
    gc.add2("minimum", [](const Tensor& x, const Tensor& y) { return x.minimum(y); }, a, b);
    gc.add2("maximum broadcast", [](const Tensor& x, const Tensor& y) { return x.maximum(y); }, a, r);
    gc.add2("minimum broadcast", [](const Tensor& x, const Tensor& y) { return y.minimum(x); }, a, r);
    In nz = rnd({2, 3}, 34, 0.2, 1, true);
    gc.add1("maximum(scalar)", [](const Tensor& x) { return x.maximum(0.1); }, nz);
    gc.add1("minimum(scalar)", [](const Tensor& x) { return x.minimum(-0.1); }, nz);
    gc.run();
}

TEST(autograd_where) {
    GradCheck gc;
    In a = rnd({2, 3}, 41), b = rnd({2, 3}, 42), r = rnd({3}, 43);
    Tensor cond = T({1, -1, 2, -2, 3, -3}, {2, 3}) > 0.0;
    gc.add2("where(c, a, b)", [cond](const Tensor& x, const Tensor& y) { return tg::where(cond, x, y); }, a, b);
    gc.add2("where(c, [3], [2,3]) broadcasts",
            [cond](const Tensor& x, const Tensor& y) { return tg::where(cond, y, x); }, a, r);
    gc.add1("where(c, 0.5, x)", [cond](const Tensor& x) { return tg::where(cond, 0.5, x); }, a);
    gc.add1("where(c, x, 0.5)", [cond](const Tensor& x) { return tg::where(cond, x, 0.5); }, a);
    gc.add1("where(x > 0, x*x, -x) (condition from the input)",
            [](const Tensor& x) { return tg::where(x > 0.0, x * x, -x); }, rnd({2, 3}, 44, 0.1, 1, true));
    gc.run();
}

// ---- reductions -------------------------------------------------------------------------------

TEST(autograd_sum_mean) {
    GradCheck gc;
    In x = rnd({2, 3, 2}, 51);
    gc.add1("sum()", [](const Tensor& t) { return t.sum(); }, x);
    gc.add1("sum(1)", [](const Tensor& t) { return t.sum(1); }, x);
    gc.add1("sum(-1, keepdim)", [](const Tensor& t) { return t.sum(-1, true); }, x);
    gc.add1("sum({0,2})", [](const Tensor& t) { return t.sum({0, 2}); }, x);
    gc.add1("sum({0,2}, keepdim)", [](const Tensor& t) { return t.sum({0, 2}, true); }, x);
    gc.add1("mean()", [](const Tensor& t) { return t.mean(); }, x);
    gc.add1("mean(0)", [](const Tensor& t) { return t.mean(0); }, x);
    gc.add1("mean(1, keepdim)", [](const Tensor& t) { return t.mean(1, true); }, x);
    gc.add1("mean({1,2})", [](const Tensor& t) { return t.mean({1, 2}); }, x);
    gc.add1("mean({0,1}, keepdim)", [](const Tensor& t) { return t.mean({0, 1}, true); }, x);
    // products, with a row holding one zero and a row holding two (their gradients are the
    // product of the others, and zero)
    In zeros = {{0.5, 0, -1.5, 2, 0.7, 1.1, 0, -0.8, 0, 1.3, -0.4, 0.9}, {3, 4}};
    gc.add1("prod(1) with zeros", [](const Tensor& t) { return t.prod(1); }, zeros);
    gc.add1("prod(0, keepdim) with zeros", [](const Tensor& t) { return t.prod(0, true); }, zeros);
    gc.add1("prod()", [](const Tensor& t) { return t.prod(); }, rnd({2, 3}, 52, 0.5, 1.5, true));
    gc.add1("sum({-1,0}) (negative axis in a list)", [](const Tensor& t) { return t.sum({-1, 0}); }, x);
    gc.add1("mean({0,1,2}, keepdim)", [](const Tensor& t) { return t.mean({0, 1, 2}, true); }, x);
    gc.add1("x * sum(x, keepdim) (reduce and broadcast back)",
            [](const Tensor& t) { return t * t.sum(1, true); }, x);
    gc.run();
}

TEST(autograd_max_min) {
    GradCheck gc;
    In x = rnd({2, 3, 2}, 52);   // distinct values: no ties, finite differences are valid
    gc.add1("max()", [](const Tensor& t) { return t.max(); }, x);
    gc.add1("max(1)", [](const Tensor& t) { return t.max(1); }, x);
    gc.add1("max(-1, keepdim)", [](const Tensor& t) { return t.max(-1, true); }, x);
    gc.add1("max({0,2})", [](const Tensor& t) { return t.max({0, 2}); }, x);
    gc.add1("max({0,1}, keepdim)", [](const Tensor& t) { return t.max({0, 1}, true); }, x);
    gc.add1("min()", [](const Tensor& t) { return t.min(); }, x);
    gc.add1("min(0)", [](const Tensor& t) { return t.min(0); }, x);
    gc.add1("min(2, keepdim)", [](const Tensor& t) { return t.min(2, true); }, x);
    gc.add1("min({1,2})", [](const Tensor& t) { return t.min({1, 2}); }, x);
    gc.add1("min({0,2}, keepdim)", [](const Tensor& t) { return t.min({0, 2}, true); }, x);
    gc.add1("max({-1,1}) (negative axis in a list)", [](const Tensor& t) { return t.max({-1, 1}); }, x);
    gc.add1("x - max(x) (as in softmax)", [](const Tensor& t) { return (t - t.max(1, true)).exp(); }, x);
    gc.run();
}

// ---- movement ---------------------------------------------------------------------------------

TEST(autograd_movement) {
    GradCheck gc;
    In x = rnd({2, 3, 2}, 61), m = rnd({3, 4}, 62), u = rnd({3, 1}, 63);
    gc.add1("reshape", [](const Tensor& t) { return t.reshape({3, 4}); }, x);
    gc.add1("reshape(-1) then multiply", [](const Tensor& t) { return t.reshape({-1, 2}) * t.reshape({6, 2}); }, x);
    gc.add1("view", [](const Tensor& t) { return t.view({4, 3}).exp(); }, x);
    gc.add1("permute", [](const Tensor& t) { return t.permute({2, 0, 1}); }, x);
    gc.add1("transpose", [](const Tensor& t) { return t.transpose(); }, m);
    gc.add1("transpose(0, 2)", [](const Tensor& t) { return t.transpose(0, 2); }, x);
    gc.add1("expand", [](const Tensor& t) { return t.expand({2, 3, 4}); }, u);
    gc.add1("expand with a new leading axis", [](const Tensor& t) { return t.expand({2, -1, -1}); }, m);
    gc.add1("pad", [](const Tensor& t) { return t.pad({{1, 0}, {2, 1}}); }, m);
    gc.add1("pad with a value", [](const Tensor& t) { return t.pad({{0, 2}, {1, 1}}, 1.5) * t.pad({{1, 1}, {0, 2}}); }, m);
    gc.add1("shrink", [](const Tensor& t) { return t.shrink({{1, 3}, {0, 3}}); }, m);
    gc.add1("slice", [](const Tensor& t) { return t.slice(1, 1, 3); }, m);
    gc.add1("slice with step 2", [](const Tensor& t) { return t.slice(1, 0, 4, 2); }, m);
    gc.add1("slice with step 3, negative start", [](const Tensor& t) { return t.slice(0, -5, 12, 3); },
            rnd({12}, 64));
    gc.add1("flip(0)", [](const Tensor& t) { return t.flip(0); }, m);
    gc.add1("flip({0,2})", [](const Tensor& t) { return t.flip({0, 2}); }, x);
    gc.add1("squeeze()", [](const Tensor& t) { return t.squeeze(); }, u);
    gc.add1("squeeze(1)", [](const Tensor& t) { return t.squeeze(1) * t.squeeze(); }, u);
    gc.add1("unsqueeze", [](const Tensor& t) { return t.unsqueeze(1) * t.unsqueeze(0); }, rnd({3}, 65));
    gc.add1("flatten", [](const Tensor& t) { return t.flatten(); }, x);
    gc.add1("flatten(1)", [](const Tensor& t) { return t.flatten(1).exp(); }, x);
    gc.add1("contiguous", [](const Tensor& t) { return t.permute({1, 0}).contiguous() * t.transpose(); }, m);
    gc.add1("x[i]", [](const Tensor& t) { return t[1] * t[-1]; }, m);
    gc.add1("chain of views", [](const Tensor& t) {
        return t.permute({1, 0, 2}).reshape({3, 4}).flip(1).pad({{0, 1}, {1, 0}}).slice(1, 0, 5, 2);
    }, x);
    gc.run();
}

// ---- matmul, einsum ---------------------------------------------------------------------------

TEST(autograd_matmul) {
    GradCheck gc;
    auto mm = [](const Tensor& a, const Tensor& b) { return a.matmul(b); };
    gc.add2("matmul 1-D @ 1-D", mm, rnd({4}, 71), rnd({4}, 72));
    gc.add2("matmul 1-D @ 2-D", mm, rnd({3}, 73), rnd({3, 2}, 74));
    gc.add2("matmul 2-D @ 1-D", mm, rnd({2, 3}, 75), rnd({3}, 76));
    gc.add2("matmul 2-D @ 2-D", mm, rnd({2, 3}, 77), rnd({3, 4}, 78));
    gc.add2("matmul batched", mm, rnd({2, 2, 3}, 79), rnd({2, 3, 2}, 80));
    gc.add2("matmul batch broadcast [2,2,3] @ [3,2]", mm, rnd({2, 2, 3}, 81), rnd({3, 2}, 82));
    gc.add2("matmul batch broadcast [2,1,1,3] @ [3,3,1]", mm, rnd({2, 1, 1, 3}, 83), rnd({3, 3, 1}, 84));
    gc.add2("relu(a @ b + 1) (fused)", [](const Tensor& a, const Tensor& b) { return (a.matmul(b) + 1.0).tanh(); },
            rnd({2, 3}, 85), rnd({3, 2}, 86));
    gc.run();
}

TEST(autograd_einsum) {
    GradCheck gc;
    auto e = [](const char* spec) {
        return [spec](const Tensor& a, const Tensor& b) { return tg::einsum(spec, {a, b}); };
    };
    gc.add2("einsum ij,jk->ik", e("ij,jk->ik"), rnd({2, 3}, 91), rnd({3, 2}, 92));
    gc.add2("einsum ij,jk (implicit)", e("ij,jk"), rnd({2, 3}, 93), rnd({3, 2}, 94));
    gc.add2("einsum i,i-> (dot)", e("i,i->"), rnd({5}, 95), rnd({5}, 96));
    gc.add2("einsum i,j->ij (outer)", e("i,j->ij"), rnd({3}, 97), rnd({2}, 98));
    gc.add2("einsum bij,bjk->bik", e("bij,bjk->bik"), rnd({2, 2, 3}, 99), rnd({2, 3, 2}, 100));
    gc.add2("einsum ...ij,...jk->...ik with broadcasting", e("...ij,...jk->...ik"), rnd({2, 2, 2}, 101),
            rnd({2, 2}, 102));
    gc.add2("einsum ...ij,...jk with a size-1 batch axis", e("...ij,...jk"), rnd({1, 2, 3}, 109),
            rnd({2, 3, 2}, 110));
    gc.add2("einsum ij,ij->j", e("ij,ij->j"), rnd({2, 3}, 103), rnd({2, 3}, 104));
    gc.add1("einsum ii->i (diagonal)", [](const Tensor& a) { return tg::einsum("ii->i", {a}); }, rnd({3, 3}, 105));
    gc.add1("einsum ii-> (trace)", [](const Tensor& a) { return tg::einsum("ii->", {a}); }, rnd({3, 3}, 106));
    gc.add1("einsum ij->ji", [](const Tensor& a) { return tg::einsum("ij->ji", {a}); }, rnd({2, 3}, 107));
    gc.add1("einsum ...i->... (ellipsis sum)", [](const Tensor& a) { return tg::einsum("...i->...", {a}); },
            rnd({2, 2, 3}, 108));
    gc.run();
}

// ---- indexing ---------------------------------------------------------------------------------

TEST(autograd_gather_index_select_embedding) {
    GradCheck gc;
    In src = rnd({4, 3}, 111);
    // repeated indices: the gradient of a row read twice is the sum of both reads'
    Tensor idx0 = I32({0, 2, 2, 3, 0, 0}, {2, 3}), idx1 = I32({1, 1, 0, 2, 2, 2, 0, 0}, {4, 2});
    gc.add1("gather(0) with repeats", [idx0](const Tensor& t) { return t.gather(0, idx0); }, src);
    gc.add1("gather(1) with repeats", [idx1](const Tensor& t) { return t.gather(1, idx1); }, src);
    // one pick per row (a label's logit): the gradient is a select; over fewer rows, a scatter
    Tensor pick1 = I32({2, 0, 1, 2}, {4, 1}), pick0 = I32({3, 0, 3}, {1, 3});
    Tensor some_rows = I32({1, 2}, {2, 1});
    gc.add1("gather(1), one pick per row",
            [pick1](const Tensor& t) { return t.gather(1, pick1); }, src);
    gc.add1("gather(0), one pick per column",
            [pick0](const Tensor& t) { return t.gather(0, pick0); }, src);
    gc.add1("gather(1), picks in some rows",
            [some_rows](const Tensor& t) { return t.gather(1, some_rows); }, src);
    Tensor sel = I32({3, 1, 3, 3, 0}, {5});
    gc.add1("index_select(0) with repeats", [sel](const Tensor& t) { return t.index_select(0, sel); }, src);
    Tensor sel1 = I32({2, 2, 0}, {3});
    gc.add1("index_select(1) with repeats", [sel1](const Tensor& t) { return t.index_select(1, sel1); }, src);
    Tensor ids = I32({0, 2, 2, 1, 2, 0}, {2, 3});
    gc.add1("embedding C[X] with repeats", [ids](const Tensor& t) { return t[ids]; }, src);
    gc.add1("embedding C[X] inside a computation",
            [ids](const Tensor& t) { return (t[ids] * t[ids]).sum(-1).tanh(); }, src);

    // scatter_add and index_add: self's gradient passes, src's is gathered at the index
    In self = rnd({3, 4}, 113), more = rnd({3, 5}, 114);
    Tensor into = I32({1, 1, 0, 2, 0, 2, 2, 1}, {2, 4}), cols = I32({3, 0, 3}, {3});
    gc.add2("scatter_add(0) with repeats, src longer than the index",
            [into](const Tensor& a, const Tensor& b) { return a.scatter_add(0, into, b); },
            self, more);
    gc.add2("index_add(1) with repeats, alpha 3",
            [cols](const Tensor& a, const Tensor& b) {
                return a.index_add(1, cols, b.slice(1, 0, 3), 3).tanh();
            },
            self, more);

    // exact: each row's gradient counts how often it is read
    Tensor c = T(randd(12, 112), {4, 3}).requires_grad();
    c[I32({0, 2, 2, 2, 0, 3}, {3, 2})].sum().backward();
    CHECK_ALL_NEAR(vals(c.grad()), (Vec{2, 2, 2, 0, 0, 0, 3, 3, 3, 1, 1, 1}), 1e-15);
    gc.run();
}

// ---- composed ---------------------------------------------------------------------------------

TEST(autograd_softmax_log_softmax) {
    GradCheck gc;
    In x = rnd({2, 4}, 121, -2, 2);
    gc.add1("softmax(-1)", [](const Tensor& t) { return t.softmax(); }, x);
    gc.add1("softmax(0)", [](const Tensor& t) { return t.softmax(0); }, x);
    gc.add1("log_softmax(-1)", [](const Tensor& t) { return t.log_softmax(); }, x);
    gc.add1("log_softmax(0)", [](const Tensor& t) { return t.log_softmax(0); }, x);
    gc.add1("softmax of a 3-D tensor over axis 1", [](const Tensor& t) { return t.softmax(1); },
            rnd({2, 3, 2}, 122, -2, 2));
    gc.run();
}

TEST(autograd_cat_stack) {
    GradCheck gc;
    In a = rnd({2, 3}, 131), b = rnd({1, 3}, 132), c = rnd({2, 2}, 133);
    gc.add2("cat axis 0", [](const Tensor& x, const Tensor& y) { return tg::cat({x, y, x}, 0); }, a, b);
    gc.add2("cat axis 1", [](const Tensor& x, const Tensor& y) { return tg::cat({y, x}, 1) * 2.0; }, a, c);
    gc.add2("stack axis 0", [](const Tensor& x, const Tensor& y) { return tg::stack({x, y * y}); }, a, a);
    gc.add2("stack axis -1", [](const Tensor& x, const Tensor& y) { return tg::stack({x, y}, -1); }, a,
            rnd({2, 3}, 134));
    gc.run();
}

TEST(autograd_losses) {
    GradCheck gc;
    In logits = rnd({3, 4}, 141, -2, 2);
    Tensor target = I32({1, 0, 3}, {3});
    gc.add1("cross_entropy (mean)", [target](const Tensor& t) { return tg::nn::cross_entropy(t, target); }, logits);
    gc.add1("cross_entropy (none)",
            [target](const Tensor& t) { return tg::nn::cross_entropy(t, target, tg::nn::Reduction::NONE); }, logits);
    Tensor y = T({0, 1, 1, 0.25, 0, 1}, {2, 3});
    gc.add1("binary_cross_entropy_with_logits",
            [y](const Tensor& t) { return tg::nn::binary_cross_entropy_with_logits(t, y); },
            rnd({2, 3}, 142, 0.1, 2, true));
    gc.add2("mse_loss (sum)",
            [](const Tensor& p, const Tensor& q) { return tg::nn::mse_loss(p, q, tg::nn::Reduction::SUM); },
            rnd({2, 3}, 143), rnd({2, 3}, 144));
    gc.add1("layer norm: (x - mean) / sqrt(var + eps)", [](const Tensor& t) {
        Tensor c = t - t.mean(-1, true);
        return c * ((c * c).mean(-1, true) + 1e-5).rsqrt();
    }, rnd({2, 4}, 145));
    Tensor labels = T({1, -1, 1, -1}, {4});
    gc.add1("hinge_loss", [labels](const Tensor& s) { return tg::nn::hinge_loss(s, labels); },
            In{{0.5, 0.2, 2.0, -0.3}, {4}});
    gc.run();
}

TEST(autograd_gradients_agree_with_backward) {
    // tg::gradients and backward() on functions that together use every primitive's rule,
    // both against finite differences
    GradCheck gc(true);
    gc.add1("elementwise primitives", [](const Tensor& x) {
        Tensor a = (-x).exp2() + (x * x + 1.0).log2() * x.sin();
        Tensor b = (x * x + 0.5).sqrt().reciprocal();
        return tg::where(x > 0.0, a, b).maximum(x * 0.25);
    }, rnd({2, 3}, 151, 0.1, 1, true));
    gc.add1("reductions and views", [](const Tensor& x) {
        Tensor y = x.permute({1, 0}).reshape({2, 3}).flip(1).pad({{1, 0}, {0, 1}}).shrink({{0, 2}, {1, 4}});
        return (y.max(0, true).expand({2, 3}) * y).contiguous().sum(1);
    }, rnd({3, 2}, 152));
    Tensor ids = I32({2, 0, 2, 1}, {2, 2});
    gc.add1("gather", [ids](const Tensor& x) { return x[ids].sum(-1) * x.sum(); }, rnd({3, 2}, 153));
    // a small MLP: gradients w.r.t. weights, biases and the input at once
    gc.add("mlp",
           [](const std::vector<Tensor>& v) {
               Tensor h = (v[0].matmul(v[1]) + v[2]).tanh();
               return (h.matmul(v[3])).log_softmax().mean();
           },
           {rnd({2, 3}, 154), rnd({3, 4}, 155), rnd({4}, 156), rnd({4, 2}, 157)});
    gc.run();
}

// ---- ties: the PyTorch convention -------------------------------------------------------------

TEST(autograd_max_ties_as_pytorch) {
    Tensor x = T({1, 3, 3, 2}, {4}).requires_grad();
    x.max().backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{0, 0.5, 0.5, 0}), 1e-15);

    Tensor y = T({1, 3, 3, 2}, {4}).requires_grad();
    y.min().backward();   // one minimum: all of it
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{1, 0, 0, 0}), 1e-15);

    Tensor z = T({5, 5, 5, 1, 1, 4}, {2, 3}).requires_grad();
    z.max(std::vector<int>{1}).sum().backward();   // row 0: three-way tie; row 1: one maximum
    CHECK_ALL_NEAR(vals(z.grad()), (Vec{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0, 1}), 1e-15);

    // max(axis) and min(axis), which give indices too, pass it to the index (the first tie)
    Tensor z1 = T({5, 5, 5, 1, 1, 4}, {2, 3}).requires_grad();
    z1.max(1).sum().backward();
    CHECK_ALL_NEAR(vals(z1.grad()), (Vec{1, 0, 0, 0, 0, 1}), 1e-15);
    Tensor z2 = T({5, 5, 5, 1, 1, 4}, {2, 3}).requires_grad();
    auto [values, indices] = z2.max(1, true);
    CHECK_EQ(values.shape(), (tg::Shape{2, 1}));
    CHECK_ALL_NEAR(vals(values), (Vec{5, 4}), 0);
    (values * T({2, 3}, {2, 1})).sum().backward();
    CHECK_ALL_NEAR(vals(z2.grad()), (Vec{2, 0, 0, 0, 0, 3}), 1e-15);

    Tensor w = T({2, 7, 2, 7}, {2, 2}).requires_grad();
    w.min(0).sum().backward();   // column 0: tie between 2 and 2
    CHECK_ALL_NEAR(vals(w.grad()), (Vec{1, 1, 0, 0}), 1e-15);
    Tensor w1 = T({2, 7, 2, 7}, {2, 2}).requires_grad();
    w1.min(std::vector<int>{0}).sum().backward();
    CHECK_ALL_NEAR(vals(w1.grad()), (Vec{0.5, 0.5, 0.5, 0.5}), 1e-15);
    Tensor s = T({3}, {}).requires_grad();   // a scalar: max(0) is itself
    s.max(0).backward();
    CHECK_ALL_NEAR(vals(s.grad()), (Vec{1}), 0);

    Tensor a = T({1, 2, 3}, {3}).requires_grad(), b = T({1, 5, 0}, {3}).requires_grad();
    a.maximum(b).sum().backward();
    CHECK_ALL_NEAR(vals(a.grad()), (Vec{0.5, 0, 1}), 1e-15);
    CHECK_ALL_NEAR(vals(b.grad()), (Vec{0.5, 1, 0}), 1e-15);

    Tensor c = T({1, 2, 3}, {3}).requires_grad(), d = T({1, 5, 0}, {3}).requires_grad();
    c.minimum(d).sum().backward();
    CHECK_ALL_NEAR(vals(c.grad()), (Vec{0.5, 1, 0}), 1e-15);
    CHECK_ALL_NEAR(vals(d.grad()), (Vec{0.5, 0, 1}), 1e-15);

    Tensor e = T({-1, 0, 2}, {3}).requires_grad();
    e.abs().sum().backward();   // |x|' = sign x, 0 at 0 (the two halves of the tie cancel)
    CHECK_ALL_NEAR(vals(e.grad()), (Vec{-1, 0, 1}), 1e-15);
}

// ---- edges: saturation and zeros, where composed rules meet 0 · ∞ ------------------------------

TEST(autograd_saturated_sigmoid_tanh_have_zero_gradient) {
    // σ'(x) = σ(1 - σ) and tanh'(x) = 1 - tanh² vanish (they do not become NaN) far from 0,
    // as in PyTorch: e^-x overflowing to ∞ must not turn the chain rule into 0 · ∞
    auto f32 = [](std::vector<float> v) {
        return Tensor::from_vector(v, {int64_t(v.size())}).requires_grad();
    };
    Tensor t32 = f32({-100, -50, 50, 100}), s32 = f32({-100, -90, 90, 100});
    Tensor t64 = T({-400, -30, 30, 400}, {4}).requires_grad();
    Tensor s64 = T({-800, -50, 50, 800}, {4}).requires_grad();
    t32.tanh().sum().backward();
    s32.sigmoid().sum().backward();
    t64.tanh().sum().backward();
    s64.sigmoid().sum().backward();
    tg::realize({t32.grad(), s32.grad(), t64.grad(), s64.grad()});
    CHECK_ALL_NEAR(vals(t32.grad()), Vec(4, 0.0), 1e-12);
    CHECK_ALL_NEAR(vals(s32.grad()), Vec(4, 0.0), 1e-12);
    CHECK_ALL_NEAR(vals(t64.grad()), Vec(4, 0.0), 1e-12);
    CHECK_ALL_NEAR(vals(s64.grad()), Vec(4, 0.0), 1e-12);
}

TEST(autograd_pow_at_zero_base) {
    // d/dx x^y = y·x^(y-1) and d/dy x^y = x^y·ln x (taken as 0 at x = 0, y > 0, as in PyTorch):
    // finite at a zero base for y >= 1, however pow is composed
    Tensor a = T({0, 1.5}, {2}).requires_grad(), b = T({0, 1.5}, {2}).requires_grad();
    Tensor c = T({0, 1.5}, {2}).requires_grad(), d = T({0, 1.5}, {2}).requires_grad();
    Tensor x = T({0, 0, 2, 0, -0.0}, {5}).requires_grad(), y = T({2, 3, 2, 1, 1}, {5}).requires_grad();
    a.pow(2.0).sum().backward();
    b.pow(1.0).sum().backward();
    c.pow(2.5).sum().backward();
    d.pow(2).sum().backward();   // integer exponent: repeated multiplication
    x.pow(y).sum().backward();
    tg::realize({a.grad(), b.grad(), c.grad(), d.grad(), x.grad(), y.grad()});
    CHECK_ALL_NEAR(vals(a.grad()), (Vec{0, 3}), 1e-12);
    CHECK_ALL_NEAR(vals(b.grad()), (Vec{1, 1}), 1e-12);
    CHECK_ALL_NEAR(vals(c.grad()), (Vec{0, 2.5 * std::pow(1.5, 1.5)}), 1e-12);
    CHECK_ALL_NEAR(vals(d.grad()), (Vec{0, 3}), 1e-12);
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{0, 0, 4, 1, 1}), 1e-12);   // x^1 is x, at 0 too
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{0, 0, 4 * std::log(2.0), 0, 0}), 1e-12);
    CHECK(std::signbit(vals(x.detach().pow(y.detach()))[4]));            // (-0)^1 = -0
}

// ---- second order -----------------------------------------------------------------------------

TEST(autograd_hessian_vector_product_cubic) {
    Vec xv = randd(5, 161), vv = randd(5, 162);
    Tensor x = T(xv, {5}).requires_grad(), v = T(vv, {5});
    Tensor f = x.pow(3).sum();
    Tensor g = tg::gradients(f, {x})[0];
    CHECK(g.tracks_grad());
    Tensor hv = tg::gradients((g * v).sum(), {x})[0];
    tg::realize({g, hv});
    Vec want_g, want_hv;
    for (size_t i = 0; i < 5; i++) {
        want_g.push_back(3 * xv[i] * xv[i]);
        want_hv.push_back(6 * xv[i] * vv[i]);
    }
    CHECK_ALL_NEAR(vals(g), want_g, 1e-12);
    CHECK_ALL_NEAR(vals(hv), want_hv, 1e-12);
}

TEST(autograd_hessian_vector_product_tanh) {
    // f(x) = sum(tanh(W x)^2) with W [4,3]; Hv against central differences of the gradient
    Vec wv = randd(12, 171), xv = randd(3, 172), vv = randd(3, 173);
    Tensor W = T(wv, {4, 3}), v = T(vv, {3});
    auto grad_at = [&](const Vec& at) {
        Tensor x = T(at, {3}).requires_grad();
        Tensor f = W.matmul(x).tanh().pow(2).sum();
        return tg::gradients(f, {x})[0];
    };
    Tensor x = T(xv, {3}).requires_grad();
    Tensor f = W.matmul(x).tanh().pow(2).sum();
    Tensor g = tg::gradients(f, {x})[0];
    Tensor hv = tg::gradients((g * v).sum(), {x})[0];
    Vec got = vals(hv);
    const double h = 1e-5;
    Vec xp = xv, xm = xv;
    for (size_t i = 0; i < 3; i++) {
        xp[i] += h * vv[i];
        xm[i] -= h * vv[i];
    }
    Vec gp = vals(grad_at(xp)), gm = vals(grad_at(xm));
    Vec want;
    for (size_t i = 0; i < 3; i++) want.push_back((gp[i] - gm[i]) / (2 * h));
    CHECK_ALL_NEAR(got, want, 1e-6);

    // and the full Hessian by hand: H = Wᵀ diag(s) W, s_k = d²/du² tanh(u)² at u = (W x)_k
    //   = 2(1 - t²)(1 - 3t²) with t = tanh u
    Vec hv_exact(3, 0.0);
    for (size_t k = 0; k < 4; k++) {
        double u = 0;
        for (size_t j = 0; j < 3; j++) u += wv[k * 3 + j] * xv[j];
        double t = std::tanh(u), s = 2 * (1 - t * t) * (1 - 3 * t * t), wv_dot = 0;
        for (size_t j = 0; j < 3; j++) wv_dot += wv[k * 3 + j] * vv[j];
        for (size_t i = 0; i < 3; i++) hv_exact[i] += wv[k * 3 + i] * s * wv_dot;
    }
    CHECK_ALL_NEAR(got, hv_exact, 1e-10);
}

TEST(autograd_hessian_vector_product_through_gather) {
    // f(C) = Σ C[X]³ with repeated ids: ∂f/∂C[r,j] = 3·n_r·C[r,j]², (Hv)[r,j] = 6·n_r·C[r,j]·v[r,j]
    // (differentiating the scatter-add of the first gradient needs gather's rule once more)
    Vec cv = randd(8, 191), vv = randd(8, 192);
    Tensor C = T(cv, {4, 2}).requires_grad(), v = T(vv, {4, 2});
    Tensor X = I32({3, 0, 3, 3, 1}, {5});
    Tensor g = tg::gradients(C[X].pow(3).sum(), {C})[0];
    Tensor hv = tg::gradients((g * v).sum(), {C})[0];
    tg::realize({g, hv});
    const double n[4] = {1, 1, 0, 3};
    Vec want_g, want_hv;
    for (size_t i = 0; i < 8; i++) {
        want_g.push_back(3 * n[i / 2] * cv[i] * cv[i]);
        want_hv.push_back(6 * n[i / 2] * cv[i] * vv[i]);
    }
    CHECK_ALL_NEAR(vals(g), want_g, 1e-12);
    CHECK_ALL_NEAR(vals(hv), want_hv, 1e-12);
}

TEST(autograd_second_derivative_of_scalar_functions) {
    // d²/dx² of sin, exp, log, sigmoid at a few points, by differentiating the gradient again
    Vec xv = {0.3, 1.1, 2.0};
    Tensor x = T(xv, {3}).requires_grad();
    Tensor g1 = tg::gradients(x.sin().sum(), {x})[0];
    Tensor g2 = tg::gradients(g1.sum(), {x})[0];
    Tensor e1 = tg::gradients(x.exp().sum(), {x})[0];
    Tensor e2 = tg::gradients(e1.sum(), {x})[0];
    Tensor l1 = tg::gradients(x.log().sum(), {x})[0];
    Tensor l2 = tg::gradients(l1.sum(), {x})[0];
    Tensor s1 = tg::gradients(x.sigmoid().sum(), {x})[0];
    Tensor s2 = tg::gradients(s1.sum(), {x})[0];
    tg::realize({g2, e2, l2, s2});
    Vec want_sin, want_exp, want_log, want_sig;
    for (double v : xv) {
        double s = 1 / (1 + std::exp(-v));
        want_sin.push_back(-std::sin(v));
        want_exp.push_back(std::exp(v));
        want_log.push_back(-1 / (v * v));
        want_sig.push_back(s * (1 - s) * (1 - 2 * s));
    }
    CHECK_ALL_NEAR(vals(g2), want_sin, 1e-12);
    CHECK_ALL_NEAR(vals(e2), want_exp, 1e-12);
    CHECK_ALL_NEAR(vals(l2), want_log, 1e-12);
    CHECK_ALL_NEAR(vals(s2), want_sig, 1e-12);
}

// ---- semantics --------------------------------------------------------------------------------

TEST(autograd_accumulate_and_zero_grad) {
    Vec xv = {1, -2, 3};
    Tensor x = T(xv, {3}).requires_grad();
    CHECK(x.tracks_grad());
    CHECK(!x.grad().defined());
    (x * x).sum().backward();                        // 2x
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{2, -4, 6}), 1e-15);
    (x * 3.0).sum().backward();                      // + 3
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{5, -1, 9}), 1e-15);
    x.zero_grad();
    CHECK(!x.grad().defined());
    (x.exp()).sum().backward();                      // e^x, nothing left from before
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{std::exp(1.0), std::exp(-2.0), std::exp(3.0)}), 1e-12);

    // backward() of the same, already computed, loss again
    x.zero_grad();
    Tensor loss = (x * x * x).sum();
    loss.backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{3, 12, 27}), 1e-15);
    CHECK(loss.realized());
    loss.backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{6, 24, 54}), 1e-15);

    // only leaves get grad(): an intermediate does not
    x.zero_grad();
    Tensor h = x * 2.0;
    (h * h).sum().backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{8, -16, 24}), 1e-15);
    CHECK(!h.grad().defined());

    // two backward() calls before anything is realized accumulate just the same
    Tensor y = T(xv, {3}).requires_grad();
    (y * y).sum().backward();
    (y * y).sum().backward();
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{4, -8, 12}), 1e-15);
}

TEST(autograd_leaf_from_computed_tensor) {
    // requires_grad() on a computed tensor makes it a leaf; its value is computed with the
    // next program
    Tensor base = T({1, 2, 3}, {3});
    Tensor a = base * 2.0;
    CHECK(!a.realized());
    a.requires_grad();
    CHECK(a.tracks_grad());
    CHECK(!base.tracks_grad());
    (a * a).sum().backward();
    CHECK_ALL_NEAR(vals(a.grad()), (Vec{4, 8, 12}), 1e-15);
    CHECK(a.realized());
    CHECK(!base.grad().defined());
    // requires_grad(false) turns tracking off again
    Tensor b = T({1, 2}, {2}).requires_grad();
    b.requires_grad(false);
    CHECK(!b.tracks_grad());
    CHECK(!(b * 2.0).tracks_grad());
}

TEST(autograd_detach_stops_gradient) {
    Vec xv = {0.5, -1.5, 2};
    Tensor x = T(xv, {3}).requires_grad();
    Tensor d = x.detach();
    CHECK(!d.tracks_grad());
    CHECK(!(d * 2.0).tracks_grad());
    CHECK_ALL_NEAR(vals(d), xv, 0);
    // x · detach(x): d/dx = detach(x) = x (not 2x)
    (x * x.detach()).sum().backward();
    CHECK_ALL_NEAR(vals(x.grad()), xv, 1e-15);
    x.zero_grad();
    // a term through detach contributes nothing
    ((x * 2.0).sum() + (x.detach().exp() * 5.0).sum()).backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{2, 2, 2}), 1e-15);
    x.zero_grad();
    // detach of a reshape, and a reshape of a detach
    ((x.reshape({3, 1}).detach() * x.reshape({3, 1})).sum() +
     (x.detach().reshape({1, 3}) * x.reshape({1, 3})).sum()).backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{1, -3, 4}), 1e-15);
    // a loss made only of detached values has nothing to differentiate
    CHECK_THROWS((x.detach() * 2.0).sum().backward(), "backward");
}

TEST(autograd_no_grad_scope) {
    Tensor x = T({1, 2, 3}, {3}).requires_grad();
    {
        tg::NoGrad no_grad;
        Tensor y = x * 2.0;
        CHECK(!y.tracks_grad());
        CHECK(!(x.exp() + x).sum().tracks_grad());
        CHECK(x.tracks_grad());   // the leaf itself is unchanged
        {
            tg::NoGrad nested;
            CHECK(!(x * x).tracks_grad());
        }
        CHECK(!(x * x).tracks_grad());   // still inside the outer scope
        CHECK_THROWS(y.sum().backward(), "backward");
    }
    Tensor z = x * 2.0;
    CHECK(z.tracks_grad());   // tracking again after the scope
    z.sum().backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{2, 2, 2}), 1e-15);
}

TEST(autograd_seed_and_errors) {
    Vec xv = {1, 2, 3, 4, 5, 6};
    Tensor x = T(xv, {2, 3}).requires_grad();
    Tensor y = x * x;
    CHECK_THROWS(y.backward(), "backward", "[2,3]");
    CHECK(!x.grad().defined());
    Vec sv = {1, -1, 0.5, 2, 0, 3};
    CHECK_THROWS(y.backward(T({1, 2, 3}, {3})), "backward", "[3]", "[2,3]");
    CHECK_THROWS(y.backward(T(sv, {3, 2})), "backward", "[3,2]", "[2,3]");
    y.backward(T(sv, {2, 3}));   // d/dx of sum(seed · x²) = 2 x · seed
    Vec want;
    for (size_t i = 0; i < 6; i++) want.push_back(2 * xv[i] * sv[i]);
    CHECK_ALL_NEAR(vals(x.grad()), want, 1e-15);
    // a seed of another float dtype is taken in the output's dtype
    x.zero_grad();
    y.backward(Tensor::from_vector(std::vector<float>{1, -1, 0.5f, 2, 0, 3}, {2, 3}));
    CHECK(x.grad().dtype() == DType::FLOAT64);
    CHECK_ALL_NEAR(vals(x.grad()), want, 1e-15);
    // a scalar with an explicit seed: the gradient is scaled
    x.zero_grad();
    x.sum().backward(Tensor::full({}, 3.0, DType::FLOAT64));
    CHECK_ALL_NEAR(vals(x.grad()), Vec(6, 3.0), 1e-15);
    // [1]-shaped outputs count as scalars
    x.zero_grad();
    x.sum(std::vector<int>{0, 1}, true).reshape({1}).backward();
    CHECK_ALL_NEAR(vals(x.grad()), Vec(6, 1.0), 1e-15);

    // nothing requires grad
    CHECK(!T(xv, {2, 3}).tracks_grad());
    CHECK_THROWS(T(xv, {2, 3}).sum().backward(), "backward");
    CHECK_THROWS(Tensor::ones({3}).sum().backward(), "backward");
    CHECK_THROWS(tg::gradients(T(xv, {6}).sum(), {x}), "backward");
    // only float tensors can require gradients
    Tensor i = I32({1, 2, 3}, {3});
    CHECK_THROWS(i.requires_grad(), "requires_grad", "int32");
    Tensor b = I32({1, 0}, {2}) > 0;
    CHECK_THROWS(b.requires_grad(), "requires_grad", "bool");
    CHECK(!i.tracks_grad());
}

TEST(autograd_integer_and_bool_paths_pass_nothing) {
    Vec xv = {-1.5, 0.5, 2.5};
    Tensor x = T(xv, {3}).requires_grad();
    Tensor positive = x > 0.0;
    CHECK(positive.dtype() == DType::BOOL);
    CHECK(!positive.tracks_grad());
    Tensor as_int = x.cast(DType::INT32);
    CHECK(!as_int.tracks_grad());
    CHECK(!as_int.cast(DType::FLOAT64).tracks_grad());
    // x · [x > 0] + float(int(x)) + x: the mask and the integer path contribute nothing
    Tensor loss = (x * positive.cast(DType::FLOAT64)).sum() + as_int.cast(DType::FLOAT64).sum() + x.sum();
    loss.backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{1, 2, 2}), 1e-15);
    CHECK_NEAR(loss.item(), 3.0 + (-1 + 0 + 2) + 1.5, 1e-15);
    // only through integer ops: nothing to differentiate
    CHECK_THROWS(as_int.cast(DType::FLOAT64).sum().backward(), "backward");
    // a float cast in the middle passes the gradient on
    Tensor y = T(xv, {3}).requires_grad();
    (y.cast(DType::FLOAT32).cast(DType::FLOAT64) * 2.0).sum().backward();
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{2, 2, 2}), 1e-15);
}

TEST(autograd_gradients_function) {
    Vec av = {1, 2, 3}, bv = {-1, 0.5, 2};
    Tensor a = T(av, {3}).requires_grad(), b = T(bv, {3}).requires_grad();
    Tensor unused = T({7, 7}, {2}).requires_grad();
    Tensor f = (a * b).sum() + a.pow(2).sum();
    std::vector<Tensor> gs = tg::gradients(f, {a, b, unused});
    CHECK_EQ(gs.size(), size_t(3));
    tg::realize(gs);
    CHECK_ALL_NEAR(vals(gs[0]), (Vec{1, 4.5, 8}), 1e-15);   // b + 2a
    CHECK_ALL_NEAR(vals(gs[1]), av, 1e-15);                  // a
    CHECK_ALL_NEAR(vals(gs[2]), (Vec{0, 0}), 0);             // not reached: zeros
    CHECK(gs[2].shape() == Shape{2});
    // gradients() does not touch grad()
    CHECK(!a.grad().defined());
    CHECK(!b.grad().defined());
    // with a seed, for a non-scalar output
    Tensor y = a * b;
    std::vector<Tensor> gy = tg::gradients(y, {a}, T({1, 10, 100}, {3}));
    CHECK_ALL_NEAR(vals(gy[0]), (Vec{-1, 5, 200}), 1e-15);
    CHECK_THROWS(tg::gradients(y, {a}), "backward", "[3]");
    // an intermediate (not a leaf) as the input
    Tensor h = a * 2.0;
    Tensor fh = (h * h).sum();
    CHECK_ALL_NEAR(vals(tg::gradients(fh, {h})[0]), (Vec{4, 8, 12}), 1e-15);
    CHECK_ALL_NEAR(vals(tg::gradients(fh, {a})[0]), (Vec{8, 16, 24}), 1e-15);
}

// retain_grad fills a computed tensor's grad(); hooks see and replace a tensor's whole gradient
// (summed over its uses) before it flows on, in backward() and tg::gradients alike
TEST(autograd_retain_grad_and_hooks) {
    Tensor x = T({1, 2, 3}, {3}).requires_grad();
    Tensor y = x * x;
    CHECK(x.is_leaf() && !y.is_leaf() && T({1}, {1}).is_leaf());
    CHECK(&y.retain_grad() == &y && y.retains_grad() && !x.retains_grad());
    ((y * 3.0).sum() + y.sum()).backward();
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{4, 4, 4}), 0);
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{8, 16, 24}), 1e-15);

    // a hook that doubles; one that only looks (its result undefined); one on the leaf
    Tensor a = T({1, -2}, {2}).requires_grad();
    Tensor h = a * 3.0;
    int looked = 0;
    Vec seen;
    h.retain_grad();
    tg::GradHookHandle doubling = h.register_hook([](const Tensor& g) { return g * 2.0; });
    h.register_hook([&](const Tensor& g) {
        looked++;
        seen = vals(g);
        return Tensor();
    });
    a.register_hook([](const Tensor& g) { return g + 1.0; });
    (h * h).sum().backward(); // d/dh = 2h = {6, -12}
    CHECK_EQ(looked, 1);
    CHECK_ALL_NEAR(seen, (Vec{12, -24}), 0); // after the doubling hook
    CHECK_ALL_NEAR(vals(h.grad()), (Vec{12, -24}), 0);
    CHECK_ALL_NEAR(vals(a.grad()), (Vec{37, -71}), 1e-15); // 3·(12, -24) + 1
    std::vector<Tensor> g = tg::gradients((h * h).sum(), {a});
    CHECK_ALL_NEAR(vals(g[0]), (Vec{37, -71}), 1e-15);
    CHECK_EQ(looked, 2);
    doubling.remove();
    doubling.remove(); // twice: nothing more
    CHECK_ALL_NEAR(vals(tg::gradients((h * h).sum(), {a})[0]), (Vec{19, -35}), 1e-15);

    // errors
    Tensor plain = T({1, 2}, {2});
    CHECK_THROWS(plain.retain_grad(), "retain_grad: the tensor does not require grad");
    CHECK_THROWS(plain.register_hook([](const Tensor& t) { return t; }),
                 "register_hook: the tensor does not require grad");
    Tensor b = T({1, 2}, {2}).requires_grad();
    b.register_hook([](const Tensor& t) { return t.sum(); });
    CHECK_THROWS(b.sum().backward(), "register_hook: the hook returned [] for a gradient of [2]",
                 "test_autograd.cpp");
}

TEST(autograd_gradients_are_lazy_and_fuse) {
    Vec xv = {0.1, -0.2, 0.3, 0.4};
    Tensor x = T(xv, {4}).requires_grad();
    Tensor loss = (x.exp() * x).sum();
    loss.backward();
    Tensor g = x.grad();
    CHECK(g.defined());
    CHECK(!g.realized());         // nothing has run yet
    CHECK(!loss.realized());
    CHECK(g.dtype() == DType::FLOAT64);
    CHECK(g.shape() == Shape{4});
    tg::Stages st = tg::inspect({g});
    CHECK(!st.graph.empty());
    CHECK(!st.c_source.empty());
    // a gradient used inside further computation; the loss and the gradient are computed in
    // the same program
    int64_t programs = tg::stats().programs_run;
    Tensor step = x - g * 0.5;
    Vec got = vals(step);
    CHECK_EQ(tg::stats().programs_run - programs, int64_t(1));
    Vec want;
    for (double v : xv) want.push_back(v - 0.5 * (1 + v) * std::exp(v));
    CHECK_ALL_NEAR(got, want, 1e-12);
    CHECK(loss.realized());
    CHECK(g.realized());
    double want_loss = 0;
    for (double v : xv) want_loss += v * std::exp(v);
    CHECK_NEAR(loss.item(), want_loss, 1e-12);
    CHECK_ALL_NEAR(vals(g), (Vec{std::exp(0.1) * 1.1, std::exp(-0.2) * 0.8, std::exp(0.3) * 1.3,
                                 std::exp(0.4) * 1.4}), 1e-12);
    CHECK_EQ(tg::stats().programs_run - programs, int64_t(1));
    // a gradient as an input of another loss
    Tensor z = T({1, 1, 1, 1}, {4}).requires_grad();
    (z * x.grad()).sum().backward();
    CHECK_ALL_NEAR(vals(z.grad()), vals(g), 1e-15);

    // the gradient of an elementwise chain is one elementwise kernel: 3·cos(x)·w
    Tensor y = T(xv, {4}).requires_grad();
    (y.sin() * 3.0 * T({1, 2, 3, 4}, {4})).sum().backward();
    tg::Stages sg = tg::inspect({y.grad()});
    size_t kernels = 0;
    for (size_t p = sg.schedule.find('K'); p != std::string::npos; p = sg.schedule.find("\nK", p + 1)) kernels++;
    CHECK_EQ(kernels, size_t(1));
    Vec want_y;
    for (size_t i = 0; i < 4; i++) want_y.push_back(3 * std::cos(xv[i]) * double(i + 1));
    CHECK_ALL_NEAR(vals(y.grad()), want_y, 1e-12);
}

TEST(autograd_gradcheck_catches_wrong_gradients) {
    // the checker itself: x · detach(x) has analytic gradient x but numerical gradient 2x
    std::vector<std::string> mismatches;
    GradCheck gc;
    gc.collect_mismatches(&mismatches);
    gc.add1("x * detach(x)", [](const Tensor& x) { return x * x.detach(); }, rnd({3}, 181));
    gc.add1("x * x", [](const Tensor& x) { return x * x; }, rnd({3}, 182));
    gc.run();
    CHECK_EQ(mismatches.size(), size_t(1));
    if (!mismatches.empty()) {
        CHECK(mismatches[0].find("x * detach(x)") != std::string::npos);
        CHECK(mismatches[0].find("finite differences") != std::string::npos);
    }
}

TEST(autograd_float32) {
    // the same machinery in float32: the gradient keeps the input's dtype
    Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}).requires_grad();
    (x * x * x).sum().backward();
    CHECK(x.grad().dtype() == DType::FLOAT32);
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{0.75, 3, 12}), 1e-6);
    // float32 leaf inside a float64 computation: the gradient is cast back to float32
    Tensor y = Tensor::from_vector(std::vector<float>{0.5f, -1.0f}, {2}).requires_grad();
    (y * T({2, 3}, {2})).sum().backward();
    CHECK(y.grad().dtype() == DType::FLOAT32);
    CHECK_ALL_NEAR(vals(y.grad()), (Vec{2, 3}), 1e-6);
}

TEST(autograd_activations_logsumexp_triangles_norms_and_losses) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    In a = rnd({2, 3}, 301, -2, 2), nz = rnd({2, 3}, 302, 0.3, 2, true);
    gc.add1("silu", [](const Tensor& x) { return x.silu(); }, a);
    gc.add1("leaky_relu", [](const Tensor& x) { return x.leaky_relu(0.1); }, nz);
    gc.add1("elu", [](const Tensor& x) { return x.elu(1.5); }, nz);
    // βx on both sides of the threshold (2 · 2.6 > 5), never at it; and where e^(βx) overflows
    gc.add1("softplus", [](const Tensor& x) { return x.softplus(2, 5); },
            In{{-3, -0.4, 0.2, 1.1, 2.6, 400}, {2, 3}});
    gc.add1("logsumexp (an axis)", [](const Tensor& x) { return x.logsumexp(1); }, a);
    gc.add1("logsumexp (all, keepdim)", [](const Tensor& x) { return x.logsumexp({0, 1}, true); },
            rnd({2, 3}, 303, -30, 30));
    gc.add1("tril, triu", [](const Tensor& x) { return x.tril(-1) * 2 + x.triu(1); },
            rnd({2, 3, 3}, 304));
    gc.add1("group_norm", [](const Tensor& x) { return F::group_norm(x, 2); }, rnd({2, 4, 3}, 305));
    In w = rnd({4}, 306, 0.5, 2), b = rnd({4}, 307);
    gc.add("group_norm (weight, bias)",
           [](const std::vector<Tensor>& v) { return F::group_norm(v[0], 1, v[1], v[2], 1e-3); },
           {rnd({2, 4, 2}, 308), w, b});
    gc.add("batch_norm (training)",
           [](const std::vector<Tensor>& v) {
               return F::batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true);
           },
           {rnd({3, 4, 2}, 309), w, b});
    Tensor mean = T(rnd({4}, 310).data, {4}), var = T(rnd({4}, 311, 0.5, 2).data, {4});
    gc.add("batch_norm (evaluating)",
           [mean, var](const std::vector<Tensor>& v) {
               return F::batch_norm(v[0], mean, var, v[1], v[2], false);
           },
           {rnd({3, 4}, 312), w, b});
    using tg::nn::Reduction;
    In p = rnd({2, 3}, 313, -2, 2), q = rnd({2, 3}, 314, -2, 2);   // |p - q| is never 0 or 1
    gc.add2("l1_loss", [](const Tensor& x, const Tensor& y) { return tg::nn::l1_loss(x, y); }, p, q);
    gc.add2("smooth_l1_loss",
            [](const Tensor& x, const Tensor& y) {
                return tg::nn::smooth_l1_loss(x, y, Reduction::SUM, 0.9);
            },
            p, q);
    gc.add2("huber_loss",
            [](const Tensor& x, const Tensor& y) {
                return tg::nn::huber_loss(x, y, Reduction::NONE, 0.9);
            },
            p, q);
    Tensor target = I32({2, -100, 0}, {3});
    gc.add1("nll_loss (an ignored target)",
            [target](const Tensor& x) { return tg::nn::nll_loss(x.log_softmax(-1), target); },
            rnd({3, 4}, 315, -2, 2));
    gc.run();
}

TEST(autograd_norm_normalize_cosine_pool_bce) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    In a = rnd({2, 3}, 321, 0.2, 2, true);
    gc.add1("norm (p 2, an axis)", [](const Tensor& x) { return x.norm(2, 1); }, a);
    gc.add1("norm (p 3, all)", [](const Tensor& x) { return x.norm(3); }, a);
    gc.add1("norm (p 1, keepdim)", [](const Tensor& x) { return x.norm(1, 0, true); }, a);
    gc.add1("normalize", [](const Tensor& x) { return F::normalize(x, 2, 1); }, a);
    gc.add2("cosine_similarity",
            [](const Tensor& x, const Tensor& y) { return F::cosine_similarity(x, y, 1); },
            rnd({2, 3}, 322), rnd({1, 3}, 323));
    gc.add1("adaptive_avg_pool2d", [](const Tensor& x) { return F::adaptive_avg_pool2d(x, {2, 3}); },
            rnd({2, 5, 4}, 324));
    Tensor t = T({0, 1, 0.25, 1, 0, 0.5}, {2, 3});
    gc.add1("binary_cross_entropy",
            [t](const Tensor& p) { return tg::nn::binary_cross_entropy(p, t); },
            rnd({2, 3}, 325, 0.05, 0.95));
    gc.run();
    // at a zero vector the gradient of a norm is 0, not NaN, as PyTorch's
    Tensor zero = Tensor::zeros({3}, DType::FLOAT64).requires_grad();
    (zero.norm() + zero.norm(3)).backward();
    CHECK_ALL_NEAR(vals(zero.grad()), Vec(3, 0.0), 0);
}

TEST(autograd_conv_transpose) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    gc.add("conv_transpose2d (stride, padding, output_padding, groups)",
           [](const std::vector<Tensor>& v) {
               return F::conv_transpose2d(v[0], v[1], v[2], 2, 1, 1, 2);
           },
           {rnd({1, 2, 2, 3}, 331), rnd({2, 2, 3, 2}, 332), rnd({4}, 333)});
    gc.run();
}

TEST(autograd_interpolate) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    gc.add1("interpolate (bilinear)", [](const Tensor& x) { return F::interpolate(x, {5, 3}, "bilinear"); },
            rnd({1, 2, 3, 4}, 341));
    gc.add1("interpolate (bilinear, align_corners)",
            [](const Tensor& x) { return F::interpolate(x, {4, 7}, "bilinear", true); }, rnd({1, 1, 3, 4}, 342));
    gc.add1("interpolate (nearest)", [](const Tensor& x) { return F::interpolate(x, {5, 2}); },
            rnd({1, 2, 3, 4}, 343));
    gc.add1("interpolate (bicubic)", [](const Tensor& x) { return F::interpolate(x, {6, 2}, "bicubic"); },
            rnd({1, 2, 3, 4}, 344));
    gc.add1("interpolate (bicubic, align_corners, by scale_factor)",
            [](const Tensor& x) {
                return F::interpolate(x, tg::nn::scale_factor({1.5, 2.5}), "bicubic", true);
            },
            rnd({1, 1, 3, 4}, 345));
    gc.add1("interpolate (trilinear)",
            [](const Tensor& x) { return F::interpolate(x, {3, 4, 2}, "trilinear"); },
            rnd({1, 1, 2, 3, 3}, 346));
    gc.run();
}

// functional's other activations, at points away from their kinks (those: test_ops.cpp)
TEST(autograd_more_activations) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    In a = rnd({2, 4}, 371, -2.9, 2.9), nz = rnd({2, 4}, 372, 0.6, 2.5, true);
    gc.add1("mish", [](const Tensor& x) { return F::mish(x); }, a);
    gc.add1("selu", [](const Tensor& x) { return F::selu(x); }, nz);
    gc.add1("celu", [](const Tensor& x) { return F::celu(x, 1.5); }, nz);
    gc.add1("softsign", [](const Tensor& x) { return F::softsign(x); }, nz);
    gc.add1("logsigmoid", [](const Tensor& x) { return F::logsigmoid(x); }, nz);
    gc.add1("tanhshrink", [](const Tensor& x) { return F::tanhshrink(x); }, a);
    gc.add1("hardswish", [](const Tensor& x) { return F::hardswish(x); }, a);
    gc.add1("hardsigmoid", [](const Tensor& x) { return F::hardsigmoid(x); }, a);
    gc.add1("softshrink", [](const Tensor& x) { return F::softshrink(x, 0.5); }, nz);
    gc.add2("prelu (per channel)",
            [](const Tensor& x, const Tensor& w) { return F::prelu(x, w); },
            rnd({2, 3, 2}, 373, 0.2, 2, true), rnd({3}, 374, 0.1, 0.5));
    gc.run();
}

// The recurrent layers in float64, both directions: gradients through the input, the
// initial states and one direction's weights (the other's held), from the outputs and states
TEST(autograd_recurrent_layers) {
    GradCheck gc;
    auto in_float64 = [](tg::nn::RNNBase& m) {
        for (auto* ps : {&m.weight_ih, &m.weight_hh, &m.bias_ih, &m.bias_hh})
            for (Tensor& p : *ps) p = p.cast(DType::FLOAT64);
    };
    std::vector<std::shared_ptr<tg::nn::RNNBase>> layers = {
        std::make_shared<tg::nn::RNN>(2, 2, 1, "tanh", true, false, 0, true),
        std::make_shared<tg::nn::LSTM>(2, 2, 1, true, false, 0, true),
        std::make_shared<tg::nn::GRU>(2, 2, 1, true, false, 0, true)};
    uint64_t seed = 361;
    for (std::shared_ptr<tg::nn::RNNBase> m : layers) {
        in_float64(*m);
        const int64_t rows = m->weight_ih[0].size(0);
        const bool is_lstm = m->mode == "LSTM";
        std::vector<In> ins = {rnd({3, 2, 2}, seed), rnd({2, 2, 2}, seed + 1),
                               rnd({rows, 2}, seed + 2), rnd({rows, 2}, seed + 3),
                               rnd({rows}, seed + 4)};
        if (is_lstm) ins.push_back(rnd({2, 2, 2}, seed + 5));   // c_0
        gc.add(m->mode.c_str(),
               [m, is_lstm](const std::vector<Tensor>& v) {
                   m->weight_ih[1] = v[2];
                   m->weight_hh[1] = v[3];
                   m->bias_hh[1] = v[4];
                   auto out = m->forward(v[0], v[1], is_lstm ? v[5] : Tensor());
                   std::vector<Tensor> parts = {out.output.flatten(), out.h_n.flatten()};
                   if (is_lstm) parts.push_back(out.c_n.flatten());
                   return tg::cat(parts);
               },
               ins);
        seed += 10;
    }
    gc.run();
}

TEST(autograd_pad_modes) {
    namespace F = tg::nn::functional;
    GradCheck gc;
    for (const char* mode : {"reflect", "replicate", "circular"})
        gc.add1(mode, [mode](const Tensor& x) { return F::pad(x, {2, 1, 1, 2}, mode); },
                rnd({1, 3, 3}, 351));
    gc.add1("constant, cut", [](const Tensor& x) { return F::pad(x, {-1, 2}, "constant", 3); },
            rnd({2, 3}, 352));
    gc.run();
}
