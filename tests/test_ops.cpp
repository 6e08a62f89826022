// Every op and dtype against a reference computed here, by plain loops in double precision.
// Inputs come from a small deterministic generator; results are read back with to_vector and
// compared elementwise (float32: ~1e-5 relative, float64: 1e-12). Several results are realized
// in one program with tg::realize({...}) to keep the number of compiles small.
#include "harness.hpp"
#include "reference.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>

using tg::DType;
using tg::Shape;
using tg::Tensor;

namespace {
using th::Lcg;
using th::randd;
using th::randf;
using th::randi;

using Vec = std::vector<double>;
using Idx = std::vector<int64_t>;

const double F32 = 1e-5;    // float32 tolerance (relative + absolute)
const double F64 = 1e-12;   // float64 tolerance

// ---- helpers (deterministic inputs: th::randf/randd/randi) ---------------------------------
template <typename T> Vec D(const std::vector<T>& v) { return Vec(v.begin(), v.end()); }
Vec vals(const Tensor& t) { return t.to_vector<double>(); }
std::vector<int> ivals(const Tensor& t) { return t.to_vector<int>(); }

// ---- index helpers ----------------------------------------------------------------------------

int64_t count(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}
Idx unravel(int64_t flat, const Shape& s) {
    Idx idx(s.size());
    for (size_t i = s.size(); i-- > 0;) {
        idx[i] = flat % s[i];
        flat /= s[i];
    }
    return idx;
}
int64_t ravel(const Idx& idx, const Shape& s) {
    int64_t f = 0;
    for (size_t i = 0; i < s.size(); i++) f = f * s[i] + idx[i];
    return f;
}
// the value of a (shape sa) seen through NumPy broadcasting at output index idx
double bread(const Vec& a, const Shape& sa, const Idx& idx) {
    size_t lead = idx.size() - sa.size();
    int64_t f = 0;
    for (size_t i = 0; i < sa.size(); i++) f = f * sa[i] + (sa[i] == 1 ? 0 : idx[lead + i]);
    return a[size_t(f)];
}
Shape bshape(const Shape& a, const Shape& b) {
    size_t n = std::max(a.size(), b.size());
    Shape out(n);
    for (size_t i = 0; i < n; i++) {
        int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
        int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
        out[i] = da == 1 ? db : da;
    }
    return out;
}
Vec ref_unary(const Vec& a, const std::function<double(double)>& f) {
    Vec out;
    for (double x : a) out.push_back(f(x));
    return out;
}
Vec ref_binary(const Vec& a, const Shape& sa, const Vec& b, const Shape& sb,
               const std::function<double(double, double)>& f) {
    Shape s = bshape(sa, sb);
    Vec out(size_t(count(s)));
    for (int64_t i = 0; i < count(s); i++) {
        Idx idx = unravel(i, s);
        out[size_t(i)] = f(bread(a, sa, idx), bread(b, sb, idx));
    }
    return out;
}
// reduce over the given (non-negative) axes; the result is in row-major order of the kept axes
enum class Red { SUM, MAX, MIN, MEAN };
Vec ref_reduce(const Vec& a, const Shape& s, const std::vector<int>& axes, Red op) {
    Shape ks = s;
    for (int ax : axes) ks[size_t(ax)] = 1;
    size_t n = size_t(count(ks));
    Vec out(n, op == Red::MAX ? -INFINITY : op == Red::MIN ? INFINITY : 0.0);
    for (int64_t i = 0; i < count(s); i++) {
        Idx idx = unravel(i, s);
        for (int ax : axes) idx[size_t(ax)] = 0;
        double& o = out[size_t(ravel(idx, ks))];
        double x = a[size_t(i)];
        if (op == Red::MAX) o = std::max(o, x);
        else if (op == Red::MIN) o = std::min(o, x);
        else o += x;
    }
    if (op == Red::MEAN)
        for (double& o : out) o /= double(count(s) / int64_t(n));
    return out;
}
// a [..., n, k] @ b [..., k, m] with broadcast batch axes (both at least 2-D)
Vec ref_matmul(const Vec& a, const Shape& sa, const Vec& b, const Shape& sb, Shape* out_shape) {
    Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2), batch = bshape(ba, bb);
    int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
    Shape os = batch;
    os.push_back(n);
    os.push_back(m);
    Vec out(size_t(count(os)));
    for (int64_t bi = 0; bi < count(batch); bi++) {
        Idx bidx = unravel(bi, batch);
        auto offset = [&](const Shape& bs) {   // flat batch index into an operand
            size_t lead = batch.size() - bs.size();
            int64_t f = 0;
            for (size_t i = 0; i < bs.size(); i++) f = f * bs[i] + (bs[i] == 1 ? 0 : bidx[lead + i]);
            return f;
        };
        int64_t oa = offset(ba) * n * k, ob = offset(bb) * k * m;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double acc = 0;
                for (int64_t p = 0; p < k; p++) acc += a[size_t(oa + i * k + p)] * b[size_t(ob + p * m + j)];
                out[size_t((bi * n + i) * m + j)] = acc;
            }
    }
    if (out_shape) *out_shape = os;
    return out;
}
// permute: out[idx] = a[idx mapped back through order]
Vec ref_permute(const Vec& a, const Shape& s, const std::vector<int>& order, Shape* out_shape) {
    Shape os;
    for (int o : order) os.push_back(s[size_t(o)]);
    Vec out(a.size());
    for (int64_t i = 0; i < count(os); i++) {
        Idx oi = unravel(i, os), si(s.size());
        for (size_t d = 0; d < order.size(); d++) si[size_t(order[d])] = oi[d];
        out[size_t(i)] = a[size_t(ravel(si, s))];
    }
    if (out_shape) *out_shape = os;
    return out;
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
    const double pi = 3.14159265358979323846;
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
}
Shape S(std::initializer_list<int64_t> s) { return Shape(s); }

// Whether x.sum({0, 2}) (a braced list of axes starting with 0) compiles: the list must not be
// ambiguous with the defaulted source-location argument.
template <typename T> auto sum_list_ok(int) -> decltype(std::declval<const T&>().sum({0, 2}), true) { return true; }
template <typename T> bool sum_list_ok(...) { return false; }
template <typename T> auto max_list_ok(int) -> decltype(std::declval<const T&>().max({0, 1}), true) { return true; }
template <typename T> bool max_list_ok(...) { return false; }

}  // namespace

// =============================================================================== creation

TEST(ops_zeros_ones_full) {
    Tensor z = Tensor::zeros({2, 3}), o = Tensor::ones({4}, DType::INT32),
           f = Tensor::full({2, 2}, 3.5), fi = Tensor::full({3}, 7, DType::INT32),
           fd = Tensor::full({2}, 0.1, DType::FLOAT64), zs = Tensor::zeros({}),
           ob = Tensor::ones({2}, DType::BOOL);
    CHECK(z.shape() == S({2, 3}));
    CHECK(z.dtype() == DType::FLOAT32);
    CHECK(o.dtype() == DType::INT32);
    CHECK(f.dtype() == DType::FLOAT32);
    CHECK(fi.dtype() == DType::INT32);
    CHECK(fd.dtype() == DType::FLOAT64);
    CHECK(ob.dtype() == DType::BOOL);
    CHECK_EQ(zs.ndim(), 0);
    tg::realize({z, o, f, fi, fd, zs, ob});
    CHECK_ALL_NEAR(vals(z), Vec(6, 0.0), 0);
    CHECK_ALL_NEAR(vals(o), Vec(4, 1.0), 0);
    CHECK_ALL_NEAR(vals(f), Vec(4, 3.5), 0);
    CHECK_ALL_NEAR(vals(fi), Vec(3, 7.0), 0);
    CHECK_ALL_NEAR(vals(fd), Vec(2, 0.1), 1e-16);   // float64 keeps 0.1 exactly as double
    CHECK_EQ(zs.item(), 0.0);
    CHECK_ALL_NEAR(ivals(ob), (std::vector<int>{1, 1}), 0);
}

TEST(ops_arange) {
    Tensor a = Tensor::arange(5);
    Tensor b = Tensor::arange(5.0);
    Tensor c = Tensor::arange(2, 10, 3);
    Tensor d = Tensor::arange(0.0, 1.0, 0.25);
    Tensor e = Tensor::arange(5, 0, -2);
    Tensor f = Tensor::arange(1.5, 4);
    Tensor g = Tensor::arange(-1.0, 1.0, 0.1);
    CHECK(a.dtype() == DType::INT32);
    CHECK(b.dtype() == DType::FLOAT32);
    CHECK(c.dtype() == DType::INT32);
    CHECK(d.dtype() == DType::FLOAT32);
    CHECK(e.dtype() == DType::INT32);
    CHECK(f.dtype() == DType::FLOAT32);
    CHECK(c.shape() == S({3}));
    CHECK(g.shape() == S({20}));
    CHECK_EQ(Tensor::arange(0).numel(), 0);
    CHECK_EQ(Tensor::arange(3, 3).numel(), 0);
    tg::realize({a, b, c, d, e, f, g});
    CHECK_ALL_NEAR(vals(a), (Vec{0, 1, 2, 3, 4}), 0);
    CHECK_ALL_NEAR(vals(b), (Vec{0, 1, 2, 3, 4}), 0);
    CHECK_ALL_NEAR(vals(c), (Vec{2, 5, 8}), 0);
    CHECK_ALL_NEAR(vals(d), (Vec{0, 0.25, 0.5, 0.75}), 0);
    CHECK_ALL_NEAR(vals(e), (Vec{5, 3, 1}), 0);
    CHECK_ALL_NEAR(vals(f), (Vec{1.5, 2.5, 3.5}), 0);
    Vec want;
    for (int i = 0; i < 20; i++) want.push_back(-1.0 + 0.1 * i);
    CHECK_ALL_NEAR(vals(g), want, F32);
}

TEST(ops_eye) {
    Tensor a = Tensor::eye(3), b = Tensor::eye(4, DType::INT32), c = Tensor::eye(2, DType::FLOAT64);
    CHECK(a.shape() == S({3, 3}));
    CHECK(a.dtype() == DType::FLOAT32);
    CHECK(b.dtype() == DType::INT32);
    CHECK(c.dtype() == DType::FLOAT64);
    tg::realize({a, b, c});
    auto eye = [](int n) {
        Vec v;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) v.push_back(i == j);
        return v;
    };
    CHECK_ALL_NEAR(vals(a), eye(3), 0);
    CHECK_ALL_NEAR(vals(b), eye(4), 0);
    CHECK_ALL_NEAR(vals(c), eye(2), 0);
}

TEST(ops_rand) {
    Tensor a = Tensor::rand({10000}, 42), b = Tensor::rand({10000}, 42), c = Tensor::rand({10000}, 43);
    Tensor m = Tensor::rand({100, 100}, 42);
    CHECK(a.dtype() == DType::FLOAT32);
    CHECK(m.shape() == S({100, 100}));
    tg::realize({a, b, c, m});
    Vec va = vals(a), vb = vals(b), vc = vals(c), vm = vals(m);
    double lo = 1, hi = 0, sum = 0;
    for (double x : va) { lo = std::min(lo, x); hi = std::max(hi, x); sum += x; }
    CHECK(lo >= 0);
    CHECK(hi < 1);
    CHECK_NEAR(sum / 10000, 0.5, 0.02);
    CHECK(va == vb);   // same seed, same values
    CHECK(va == vm);   // the values depend on the seed and the flat index, not the shape
    int same = 0;
    for (size_t i = 0; i < va.size(); i++) same += va[i] == vc[i];
    CHECK(same < 10);  // a different seed gives different values
    int distinct_neighbours = 0;
    for (size_t i = 1; i < va.size(); i++) distinct_neighbours += va[i] != va[i - 1];
    CHECK(distinct_neighbours > 9990);
    // the default seed comes from a global stream: two calls differ, manual_seed replays
    tg::manual_seed(7);
    Tensor d1 = Tensor::rand({64});
    Tensor d2 = Tensor::rand({64});
    tg::manual_seed(7);
    Tensor d3 = Tensor::rand({64});
    tg::realize({d1, d2, d3});
    CHECK(vals(d1) != vals(d2));
    CHECK(vals(d1) == vals(d3));
    // seed 0, index 0 (a fresh process's first draw) is no fixed point of the hash: it drew 0,
    // so a process's first randn was 0 and a first layer's first weight its bound's minus
    Vec zero_seed = vals(Tensor::rand({4}, 0)), first_normal = vals(Tensor::randn({4}, 0));
    CHECK(zero_seed[0] > 0 && zero_seed[0] < 1);
    CHECK(first_normal[0] != 0);
}

TEST(ops_randn) {
    Tensor a = Tensor::randn({10000}, 5), b = Tensor::randn({10000}, 5);
    CHECK(a.dtype() == DType::FLOAT32);
    tg::realize({a, b});
    Vec v = vals(a);
    double sum = 0, sq = 0;
    bool finite = true;
    for (double x : v) { sum += x; finite = finite && std::isfinite(x); }
    double mean = sum / double(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    double sd = std::sqrt(sq / double(v.size() - 1));
    CHECK(finite);
    CHECK(std::fabs(mean) < 0.05);
    CHECK(std::fabs(sd - 1) < 0.05);
    CHECK(v == vals(b));
    int beyond3 = 0;   // about 0.27% of a normal sample lies beyond 3 sigma
    for (double x : v) beyond3 += std::fabs(x) > 3;
    CHECK(beyond3 > 5 && beyond3 < 60);
}

TEST(ops_from_vector) {
    Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2, 3.25f, 4, 5, 6}, {2, 3});
    Tensor d = Tensor::from_vector(std::vector<double>{0.1, 1e-300, -3});
    Tensor i = Tensor::from_vector(std::vector<int32_t>{-7, 0, 2147483647, -2147483647 - 1}, {2, 2});
    CHECK(f.dtype() == DType::FLOAT32);
    CHECK(d.dtype() == DType::FLOAT64);
    CHECK(i.dtype() == DType::INT32);
    CHECK(f.shape() == S({2, 3}));
    CHECK(d.shape() == S({3}));
    CHECK(i.shape() == S({2, 2}));
    CHECK_ALL_NEAR(vals(f), (Vec{1.5, -2, 3.25, 4, 5, 6}), 0);
    CHECK_ALL_NEAR(vals(d), (Vec{0.1, 1e-300, -3}), 0);
    CHECK(d.to_vector<double>()[1] == 1e-300);
    CHECK_ALL_NEAR(i.to_vector<int64_t>(), (std::vector<int64_t>{-7, 0, 2147483647, -2147483648LL}), 0);
    // one value and no shape: 1-D of size 1, like torch.tensor([x]); shape {} asks for a scalar
    CHECK(Tensor::from_vector(std::vector<float>{0.5f}).shape() == S({1}));
    CHECK(Tensor::from_vector(std::vector<int32_t>{3}).shape() == S({1}));
    Tensor scalar = Tensor::from_vector(std::vector<float>{2.5f}, {});
    CHECK(scalar.shape() == S({}));
    CHECK_EQ(scalar.item(), 2.5);
    // an explicit shape of one element
    CHECK(Tensor::from_vector(std::vector<double>{2}, {1, 1}).shape() == S({1, 1}));
    // a computed result of a float64 input stays float64
    Tensor d2 = d * 3;
    CHECK(d2.dtype() == DType::FLOAT64);
    CHECK_ALL_NEAR(vals(d2), (Vec{0.1 * 3, 3e-300, -9}), F64);
    // bools, and braced lists whose elements name the dtype
    Tensor b = Tensor::from_vector(std::vector<bool>{true, false, true, true});
    CHECK(b.dtype() == DType::BOOL);
    CHECK(b.to_vector<int64_t>() == (std::vector<int64_t>{1, 0, 1, 1}));
    CHECK_EQ(b.sum().item(), 3);
    Tensor lf = Tensor::from_vector({1.5f, 2.f, -3.f}), li = Tensor::from_vector({4, -5}, {2, 1});
    Tensor ld = Tensor::from_vector({0.1, 0.2}), lb = Tensor::from_vector({false, true});
    Tensor ll = Tensor::from_vector({int64_t(1) << 40, int64_t(-3)});
    CHECK(lf.dtype() == DType::FLOAT32 && lf.shape() == S({3}));
    CHECK(li.dtype() == DType::INT32 && li.shape() == S({2, 1}));
    CHECK(ld.dtype() == DType::FLOAT64 && lb.dtype() == DType::BOOL);
    CHECK(ll.dtype() == DType::INT64);
    CHECK_ALL_NEAR(vals(lf), (Vec{1.5, 2, -3}), 0);
    CHECK(li.to_vector<int64_t>() == (std::vector<int64_t>{4, -5}));
    CHECK(ld.to_vector<double>() == (std::vector<double>{0.1, 0.2}));
    CHECK(lb.to_vector<int64_t>() == (std::vector<int64_t>{0, 1}));
    CHECK(ll.to_vector<int64_t>() == (std::vector<int64_t>{int64_t(1) << 40, -3}));
}

// =============================================================================== elementwise

TEST(ops_binary_tensor_tensor) {
    std::vector<float> av = randf(64, 1, -3, 3), bv = randf(64, 2, 0.5, 4);
    for (size_t i = 0; i < bv.size(); i += 3) bv[i] = -bv[i];   // some negative divisors
    Tensor a = Tensor::from_vector(av, {8, 8}), b = Tensor::from_vector(bv, {8, 8});
    Tensor add = a + b, sub = a - b, mul = a * b, div = a / b;
    tg::realize({add, sub, mul, div});
    Vec A = D(av), B = D(bv);
    Shape s = {8, 8};
    CHECK(add.shape() == s);
    CHECK(div.dtype() == DType::FLOAT32);
    CHECK_ALL_NEAR(vals(add), ref_binary(A, s, B, s, [](double x, double y) { return x + y; }), F32);
    CHECK_ALL_NEAR(vals(sub), ref_binary(A, s, B, s, [](double x, double y) { return x - y; }), F32);
    CHECK_ALL_NEAR(vals(mul), ref_binary(A, s, B, s, [](double x, double y) { return x * y; }), F32);
    CHECK_ALL_NEAR(vals(div), ref_binary(A, s, B, s, [](double x, double y) { return x / y; }), F32);
}

TEST(ops_binary_float64) {
    std::vector<double> av = randd(50, 3, -3, 3), bv = randd(50, 4, 0.5, 4);
    Tensor a = Tensor::from_vector(av), b = Tensor::from_vector(bv);
    Tensor add = a + b, sub = a - b, mul = a * b, div = a / b, neg = -a, sdiv = 1.0 / b;
    tg::realize({add, sub, mul, div, neg, sdiv});
    CHECK(div.dtype() == DType::FLOAT64);
    Vec A = av, B = bv, r_add, r_sub, r_mul, r_div, r_neg, r_sdiv;
    for (size_t i = 0; i < A.size(); i++) {
        r_add.push_back(A[i] + B[i]);
        r_sub.push_back(A[i] - B[i]);
        r_mul.push_back(A[i] * B[i]);
        r_div.push_back(A[i] / B[i]);
        r_neg.push_back(-A[i]);
        r_sdiv.push_back(1.0 / B[i]);
    }
    CHECK_ALL_NEAR(vals(add), r_add, F64);
    CHECK_ALL_NEAR(vals(sub), r_sub, F64);
    CHECK_ALL_NEAR(vals(mul), r_mul, F64);
    CHECK_ALL_NEAR(vals(div), r_div, F64);
    CHECK_ALL_NEAR(vals(neg), r_neg, F64);
    CHECK_ALL_NEAR(vals(sdiv), r_sdiv, F64);
}

TEST(ops_binary_scalar_both_sides) {
    std::vector<float> tv = randf(24, 5, 0.5, 3);
    for (size_t i = 0; i < tv.size(); i += 2) tv[i] = -tv[i];
    Tensor t = Tensor::from_vector(tv, {4, 6});
    std::vector<Tensor> outs = {t + 2,    2 + t,    t - 2,    2.0f - t, t * 3,  3 * t,
                                t / 3,    3 / t,    t + 0.5,  -1.5 * t, 2.5 / t, t - 0.25f};
    std::vector<std::function<double(double)>> refs = {
        [](double x) { return x + 2; },   [](double x) { return 2 + x; },
        [](double x) { return x - 2; },   [](double x) { return 2 - x; },
        [](double x) { return x * 3; },   [](double x) { return 3 * x; },
        [](double x) { return x / 3; },   [](double x) { return 3 / x; },
        [](double x) { return x + 0.5; }, [](double x) { return -1.5 * x; },
        [](double x) { return 2.5 / x; }, [](double x) { return x - 0.25; }};
    tg::realize(outs);
    for (size_t k = 0; k < outs.size(); k++) {
        CHECK(outs[k].dtype() == DType::FLOAT32);
        CHECK(outs[k].shape() == S({4, 6}));
        CHECK_ALL_NEAR(vals(outs[k]), ref_unary(D(tv), refs[k]), F32);
    }
}

TEST(ops_unary_minus) {
    Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2, 0});
    Tensor i = Tensor::from_vector(std::vector<int32_t>{3, -4, 0});
    Tensor nf = -f, ni = -i;
    CHECK(ni.dtype() == DType::INT32);
    tg::realize({nf, ni});
    CHECK_ALL_NEAR(vals(nf), (Vec{-1.5, 2, 0}), 0);
    CHECK_ALL_NEAR(vals(ni), (Vec{-3, 4, 0}), 0);
}

TEST(ops_unary_math_float32) {
    std::vector<float> wide = randf(200, 11, -5, 5), pos = randf(200, 12, 0.05, 20);
    std::vector<float> trig = randf(200, 13, -7, 7);
    wide[0] = 0;
    wide[1] = -0.0f;
    Tensor w = Tensor::from_vector(wide), p = Tensor::from_vector(pos), tr = Tensor::from_vector(trig);
    struct Case { const char* name; Tensor out; Vec want; double tol; };
    Vec W = D(wide), P = D(pos), T = D(trig);
    std::vector<Case> cases = {
        {"exp", w.exp(), ref_unary(W, [](double x) { return std::exp(x); }), F32},
        {"log", p.log(), ref_unary(P, [](double x) { return std::log(x); }), F32},
        {"exp2", w.exp2(), ref_unary(W, [](double x) { return std::exp2(x); }), F32},
        {"log2", p.log2(), ref_unary(P, [](double x) { return std::log2(x); }), F32},
        {"sqrt", p.sqrt(), ref_unary(P, [](double x) { return std::sqrt(x); }), F32},
        {"rsqrt", p.rsqrt(), ref_unary(P, [](double x) { return 1 / std::sqrt(x); }), F32},
        {"reciprocal", p.reciprocal(), ref_unary(P, [](double x) { return 1 / x; }), F32},
        {"sin", tr.sin(), ref_unary(T, [](double x) { return std::sin(x); }), F32},
        {"cos", tr.cos(), ref_unary(T, [](double x) { return std::cos(x); }), F32},
        {"tanh", w.tanh(), ref_unary(W, [](double x) { return std::tanh(x); }), F32},
        {"sigmoid", (w * 2).sigmoid(), ref_unary(W, [](double x) { return sigmoid(2 * x); }), F32},
        {"relu", w.relu(), ref_unary(W, [](double x) { return x > 0 ? x : 0.0; }), 0},
        {"gelu", w.gelu(), ref_unary(W, gelu_erf), 1e-6},
        {"gelu_tanh", w.gelu(true), ref_unary(W, gelu_tanh), F32},
        {"abs", w.abs(), ref_unary(W, [](double x) { return std::fabs(x); }), 0},
    };
    std::vector<Tensor> outs;
    for (auto& c : cases) outs.push_back(c.out);
    tg::realize(outs);
    for (auto& c : cases) {
        CHECK(c.out.dtype() == DType::FLOAT32);
        CHECK(c.out.shape() == S({200}));
        Vec got = vals(c.out);
        CHECK_EQ(got.size(), c.want.size());
        for (size_t i = 0; i < got.size() && i < c.want.size(); i++) {
            if (th::near(got[i], c.want[i], c.tol)) continue;
            std::ostringstream os;
            os.precision(9);
            os << c.name << "(" << W[i] << " / " << P[i] << " / " << T[i] << ") at " << i << ": got "
               << got[i] << ", want " << c.want[i];
            th::report(__FILE__, __LINE__, os.str());
            break;
        }
    }
}

TEST(ops_unary_edge_values) {
    Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 4, 100});
    Tensor big = Tensor::from_vector(std::vector<float>{-100, -20, 20, 100});
    Tensor lg = x.log(), sq = x.sqrt(), sg = big.sigmoid(), th_ = big.tanh(), ex = big.exp();
    tg::realize({lg, sq, sg, th_, ex});
    Vec l = vals(lg);
    CHECK(std::isinf(l[0]) && l[0] < 0);   // log 0 = -inf
    CHECK_NEAR(l[1], 0, F32);
    CHECK_ALL_NEAR(vals(sq), (Vec{0, 1, 2, 10}), F32);
    CHECK_ALL_NEAR(vals(sg), (Vec{sigmoid(-100), sigmoid(-20), sigmoid(20), 1}), F32);
    CHECK_ALL_NEAR(vals(th_), (Vec{-1, -1, 1, 1}), F32);
    Vec e = vals(ex);
    CHECK_NEAR(e[1], std::exp(-20.0), F32);
    CHECK_NEAR(e[2] / std::exp(20.0), 1, F32);
    CHECK(std::isinf(e[3]));                // e^100 overflows float32
}

// float32 2^x and log2 x are arithmetic of our own (so loops that compute them vectorize):
// over their whole range, subnormal inputs and results included, on the C backend and the
// interpreter, 2^x is within 1.5 units in the last place of the exact value and log2 x within
// 1; the special values are C's exp2f and log2f ones.
namespace {
double ulps_off(float got, double exact) {   // beyond float32's range: exactly its infinity
    if (std::isnan(exact)) return std::isnan(got) ? 0 : INFINITY;
    if (std::isinf(float(exact)) || std::isinf(got)) return got == float(exact) ? 0 : INFINITY;
    float e = std::fabs(float(exact));
    double ulp = double(std::nextafter(e, INFINITY)) - double(e);
    return std::fabs(double(got) - exact) / ulp;
}
}  // namespace
TEST(ops_exp2_log2_float32_within_1_5_ulp) {
    std::vector<float> xs, ys;
    for (double x = -152; x < 130; x += 0.0171) xs.push_back(float(x));
    for (int e = -149; e <= 127; e++)
        for (int i = 0; i < 97; i++) ys.push_back(std::ldexp(1.0f + float(i) / 97, e));
    const float specials[] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, FLT_MAX, 1.0f};
    for (float v : specials) {
        xs.push_back(v);
        ys.push_back(v);
    }
    for (const char* device : {"CPU", "INTERP"}) {
        th::EnvGuard env("TG_DEVICE", device);
        std::vector<float> e2 = Tensor::from_vector(xs).exp2().to_vector();
        std::vector<float> l2 = Tensor::from_vector(ys).log2().to_vector();
        double worst_exp2 = 0, worst_log2 = 0;
        for (size_t i = 0; i < xs.size(); i++)
            worst_exp2 = std::max(worst_exp2, ulps_off(e2[i], std::exp2(double(xs[i]))));
        for (size_t i = 0; i < ys.size(); i++)
            worst_log2 = std::max(worst_log2, ulps_off(l2[i], std::log2(double(ys[i]))));
        CHECK(worst_exp2 <= 1.5);
        CHECK(worst_log2 <= 1.0);
    }
}

TEST(ops_unary_math_float64) {
    std::vector<double> wide = randd(100, 21, -5, 5), pos = randd(100, 22, 0.05, 20);
    Tensor w = Tensor::from_vector(wide), p = Tensor::from_vector(pos);
    std::vector<Tensor> outs = {w.exp(), p.log(), p.sqrt(), w.sin(),     w.cos(), w.tanh(),
                                w.sigmoid(), p.rsqrt(), w.exp2(), p.log2(), w.abs(), w.relu()};
    std::vector<Vec> want = {
        ref_unary(wide, [](double x) { return std::exp(x); }),
        ref_unary(pos, [](double x) { return std::log(x); }),
        ref_unary(pos, [](double x) { return std::sqrt(x); }),
        ref_unary(wide, [](double x) { return std::sin(x); }),
        ref_unary(wide, [](double x) { return std::cos(x); }),
        ref_unary(wide, [](double x) { return std::tanh(x); }),
        ref_unary(wide, sigmoid),
        ref_unary(pos, [](double x) { return 1 / std::sqrt(x); }),
        ref_unary(wide, [](double x) { return std::exp2(x); }),
        ref_unary(pos, [](double x) { return std::log2(x); }),
        ref_unary(wide, [](double x) { return std::fabs(x); }),
        ref_unary(wide, [](double x) { return std::max(x, 0.0); })};
    tg::realize(outs);
    for (size_t k = 0; k < outs.size(); k++) {
        CHECK(outs[k].dtype() == DType::FLOAT64);
        CHECK_ALL_NEAR(vals(outs[k]), want[k], F64);
    }
    // gelu in float64 is limited by its erf approximation (|error| < 1.5e-7)
    Tensor g = w.gelu();
    CHECK(g.dtype() == DType::FLOAT64);
    CHECK_ALL_NEAR(vals(g), ref_unary(wide, gelu_erf), 1e-6);
}

TEST(ops_unary_int_inputs) {
    // transcendental functions of integers give float32; abs/relu/neg keep int32
    Tensor i = Tensor::from_vector(std::vector<int32_t>{-3, -1, 0, 2, 5});
    Tensor e = i.exp(), s = i.sqrt(), a = i.abs(), r = i.relu(), sg = i.sigmoid();
    CHECK(e.dtype() == DType::FLOAT32);
    CHECK(s.dtype() == DType::FLOAT32);
    CHECK(sg.dtype() == DType::FLOAT32);
    CHECK(a.dtype() == DType::INT32);
    CHECK(r.dtype() == DType::INT32);
    tg::realize({e, s, a, r, sg});
    Vec I = {-3, -1, 0, 2, 5};
    CHECK_ALL_NEAR(vals(e), ref_unary(I, [](double x) { return std::exp(x); }), F32);
    Vec sv = vals(s);
    CHECK(std::isnan(sv[0]) && std::isnan(sv[1]));
    CHECK_NEAR(sv[3], std::sqrt(2.0), F32);
    CHECK_ALL_NEAR(vals(a), (Vec{3, 1, 0, 2, 5}), 0);
    CHECK_ALL_NEAR(vals(r), (Vec{0, 0, 0, 2, 5}), 0);
    CHECK_ALL_NEAR(vals(sg), ref_unary(I, sigmoid), F32);
}

TEST(ops_pow_tensor_exponent) {
    std::vector<float> base = {-2, -2, -3, 2, 0, 0, 1.5f, -1.5f, 4, -2, 3, 0.5f, -1, 2};
    std::vector<float> expo = {3, 2, 0, 0.5f, 0, 2, 2, 2.5f, -0.5f, -1, -2, 3, 7, 10};
    Tensor b = Tensor::from_vector(base), e = Tensor::from_vector(expo);
    Tensor p = b.pow(e);
    CHECK(p.dtype() == DType::FLOAT32);
    Vec want;
    for (size_t i = 0; i < base.size(); i++) want.push_back(std::pow(double(base[i]), double(expo[i])));
    CHECK(std::isnan(want[7]));   // negative base, fractional exponent
    CHECK_ALL_NEAR(vals(p), want, F32);
    // float64 and broadcasting of the exponent
    std::vector<double> bd = randd(12, 31, 0.1, 3);
    Tensor x = Tensor::from_vector(bd, {3, 4});
    Tensor ex = Tensor::from_vector(std::vector<double>{0.5, 1, 2, -1.5}, {4});
    Tensor px = x.pow(ex);
    CHECK(px.dtype() == DType::FLOAT64);
    CHECK(px.shape() == S({3, 4}));
    CHECK_ALL_NEAR(vals(px), ref_binary(bd, {3, 4}, {0.5, 1, 2, -1.5}, {4},
                                        [](double u, double v) { return std::pow(u, v); }),
                   F64);
}

TEST(ops_pow_scalar_exponent) {
    Tensor i = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, -4, 0});
    Tensor i2 = i.pow(2), i3 = i.pow(3), i0 = i.pow(0), ih = i.pow(0.5);
    CHECK(i2.dtype() == DType::INT32);   // int ^ small int stays int32
    CHECK(i3.dtype() == DType::INT32);
    CHECK(i0.dtype() == DType::INT32);
    CHECK(ih.dtype() == DType::FLOAT32);
    std::vector<float> fv = {0.5f, 1, 2.5f, -1.5f, 3};
    Tensor f = Tensor::from_vector(fv);
    Tensor f3 = f.pow(3), fm1 = f.pow(-1), f25 = f.pow(2.5), fh = f.pow(0.5), f0 = f.pow(0), fm2 = f.pow(-2);
    std::vector<Tensor> outs = {i2, i3, i0, ih, f3, fm1, f25, fh, f0, fm2};
    tg::realize(outs);
    CHECK_ALL_NEAR(vals(i2), (Vec{1, 4, 9, 16, 0}), 0);
    CHECK_ALL_NEAR(vals(i3), (Vec{1, 8, 27, -64, 0}), 0);
    CHECK_ALL_NEAR(vals(i0), (Vec{1, 1, 1, 1, 1}), 0);
    Vec h = vals(ih);
    CHECK_NEAR(h[1], std::sqrt(2.0), F32);
    CHECK(std::isnan(h[3]));
    Vec F = D(fv);
    auto powr = [&](double e) { return ref_unary(F, [e](double x) { return std::pow(x, e); }); };
    CHECK_ALL_NEAR(vals(f3), powr(3), F32);
    CHECK_ALL_NEAR(vals(fm1), powr(-1), F32);
    CHECK_ALL_NEAR(vals(f25), powr(2.5), F32);   // NaN for -1.5
    CHECK_ALL_NEAR(vals(fh), powr(0.5), F32);
    CHECK_ALL_NEAR(vals(f0), powr(0), F32);
    CHECK_ALL_NEAR(vals(fm2), powr(-2), F32);
}

TEST(ops_maximum_minimum) {
    std::vector<float> av = randf(30, 41, -2, 2), bv = randf(30, 42, -2, 2);
    av[3] = bv[3];
    Tensor a = Tensor::from_vector(av, {5, 6}), b = Tensor::from_vector(bv, {5, 6});
    Tensor c = Tensor::from_vector(std::vector<float>{-1, 0, 1, 0.5f, -0.5f, 2}, {6});
    Tensor ia = Tensor::from_vector(std::vector<int32_t>{-5, 3, 7, 0}),
           ib = Tensor::from_vector(std::vector<int32_t>{2, 3, -8, 1});
    std::vector<Tensor> outs = {a.maximum(b), a.minimum(b), a.maximum(0.25), a.minimum(-0.5),
                                a.maximum(c), ia.maximum(ib), ia.minimum(ib), ia.maximum(1)};
    tg::realize(outs);
    Vec A = D(av), B = D(bv);
    auto mx = [](double x, double y) { return std::max(x, y); };
    auto mn = [](double x, double y) { return std::min(x, y); };
    CHECK_ALL_NEAR(vals(outs[0]), ref_binary(A, {5, 6}, B, {5, 6}, mx), 0);
    CHECK_ALL_NEAR(vals(outs[1]), ref_binary(A, {5, 6}, B, {5, 6}, mn), 0);
    CHECK_ALL_NEAR(vals(outs[2]), ref_unary(A, [](double x) { return std::max(x, 0.25); }), 0);
    CHECK_ALL_NEAR(vals(outs[3]), ref_unary(A, [](double x) { return std::min(x, -0.5); }), 0);
    CHECK_ALL_NEAR(vals(outs[4]), ref_binary(A, {5, 6}, {-1, 0, 1, 0.5, -0.5, 2}, {6}, mx), 0);
    CHECK(outs[5].dtype() == DType::INT32);
    CHECK(outs[7].dtype() == DType::INT32);
    CHECK_ALL_NEAR(vals(outs[5]), (Vec{2, 3, 7, 1}), 0);
    CHECK_ALL_NEAR(vals(outs[6]), (Vec{-5, 3, -8, 0}), 0);
    CHECK_ALL_NEAR(vals(outs[7]), (Vec{1, 3, 7, 1}), 0);
}

TEST(ops_where) {
    std::vector<float> av = randf(12, 51), bv = randf(12, 52);
    Tensor a = Tensor::from_vector(av, {3, 4}), b = Tensor::from_vector(bv, {3, 4});
    Tensor cond = a > b;
    Tensor rowc = Tensor::from_vector(std::vector<int32_t>{1, 0, 1}, {3, 1}) == 1;   // broadcast cond
    std::vector<Tensor> outs = {tg::where(cond, a, b), tg::where(cond, 1.0f, b), tg::where(cond, a, 0),
                                tg::where(rowc, a, b), tg::where(a > 0, a, -1.5)};
    tg::realize(outs);
    Vec A = D(av), B = D(bv), w0, w1, w2, w3, w4;
    for (size_t i = 0; i < 12; i++) {
        bool c = A[i] > B[i], r = (i / 4) != 1;
        w0.push_back(c ? A[i] : B[i]);
        w1.push_back(c ? 1.0 : B[i]);
        w2.push_back(c ? A[i] : 0.0);
        w3.push_back(r ? A[i] : B[i]);
        w4.push_back(A[i] > 0 ? A[i] : -1.5);
    }
    CHECK(outs[3].shape() == S({3, 4}));
    CHECK_ALL_NEAR(vals(outs[0]), w0, 0);
    CHECK_ALL_NEAR(vals(outs[1]), w1, 0);
    CHECK_ALL_NEAR(vals(outs[2]), w2, 0);
    CHECK_ALL_NEAR(vals(outs[3]), w3, 0);
    CHECK_ALL_NEAR(vals(outs[4]), w4, 0);
    // dtypes: int branches stay int, int/float promote
    Tensor i = Tensor::from_vector(std::vector<int32_t>{1, 2, 3});
    Tensor f = Tensor::from_vector(std::vector<float>{0.5f, 1.5f, 2.5f});
    Tensor m = Tensor::from_vector(std::vector<int32_t>{1, 0, 1}) != 0;
    Tensor wi = tg::where(m, i, 0), wf = tg::where(m, i, f);
    CHECK(wi.dtype() == DType::INT32);
    CHECK(wf.dtype() == DType::FLOAT32);
    tg::realize({wi, wf});
    CHECK_ALL_NEAR(vals(wi), (Vec{1, 0, 3}), 0);
    CHECK_ALL_NEAR(vals(wf), (Vec{1, 1.5, 3}), 0);
}

TEST(ops_comparisons) {
    std::vector<float> av = {1, 2, 3, 4, -1, 0, 2.5f, 7}, bv = {1, 3, 2, 4, 0, 0, 2, 8};
    Tensor a = Tensor::from_vector(av), b = Tensor::from_vector(bv);
    std::vector<Tensor> outs = {a < b, a <= b, a > b, a >= b, a == b, a != b,
                                a < 2, 2 < a, a >= 2.5, a == 4, a != 0, 3 > a};
    tg::realize(outs);
    for (const Tensor& t : outs) CHECK(t.dtype() == DType::BOOL);
    std::vector<std::function<bool(double, double)>> f = {
        [](double x, double y) { return x < y; },  [](double x, double y) { return x <= y; },
        [](double x, double y) { return x > y; },  [](double x, double y) { return x >= y; },
        [](double x, double y) { return x == y; }, [](double x, double y) { return x != y; }};
    for (size_t k = 0; k < f.size(); k++) {
        std::vector<int> want;
        for (size_t i = 0; i < av.size(); i++) want.push_back(f[k](av[i], bv[i]));
        CHECK_ALL_NEAR(ivals(outs[k]), want, 0);
    }
    std::vector<std::function<bool(double)>> g = {
        [](double x) { return x < 2; },   [](double x) { return 2 < x; },
        [](double x) { return x >= 2.5; }, [](double x) { return x == 4; },
        [](double x) { return x != 0; },  [](double x) { return 3 > x; }};
    for (size_t k = 0; k < g.size(); k++) {
        std::vector<int> want;
        for (float x : av) want.push_back(g[k](x));
        CHECK_ALL_NEAR(ivals(outs[6 + k]), want, 0);
    }
    // int32 against float scalar, broadcasting comparisons, logical_not
    Tensor i = Tensor::from_vector(std::vector<int32_t>{1, 2, 3});
    Tensor c1 = i < 2.5, c2 = i.reshape({3, 1}) == i, c3 = (i > 1).logical_not();
    CHECK(c2.shape() == S({3, 3}));
    tg::realize({c1, c2, c3});
    CHECK_ALL_NEAR(ivals(c1), (std::vector<int>{1, 1, 0}), 0);
    CHECK_ALL_NEAR(ivals(c2), (std::vector<int>{1, 0, 0, 0, 1, 0, 0, 0, 1}), 0);
    CHECK_ALL_NEAR(ivals(c3), (std::vector<int>{1, 0, 0}), 0);
}

// =============================================================================== broadcasting

TEST(ops_broadcasting) {
    std::vector<float> a31 = randf(3, 61), b4 = randf(4, 62), c234 = randf(24, 63), d31 = randf(3, 64),
                       e14 = randf(4, 65), f = randf(6, 66);
    Tensor A = Tensor::from_vector(a31, {3, 1}), B = Tensor::from_vector(b4, {4}),
           C = Tensor::from_vector(c234, {2, 3, 4}), Dt = Tensor::from_vector(d31, {3, 1}),
           E = Tensor::from_vector(e14, {1, 4}), F = Tensor::from_vector(f, {2, 3});
    Tensor s = Tensor::full({}, 2.5);
    Tensor r1 = A + B, r2 = C * Dt, r3 = E - A, r4 = s * F, r5 = C / (B + 3), r6 = C.maximum(A);
    tg::realize({r1, r2, r3, r4, r5, r6});
    CHECK(r1.shape() == S({3, 4}));
    CHECK(r2.shape() == S({2, 3, 4}));
    CHECK(r3.shape() == S({3, 4}));
    CHECK(r4.shape() == S({2, 3}));
    CHECK(r5.shape() == S({2, 3, 4}));
    CHECK(r6.shape() == S({2, 3, 4}));
    auto add = [](double x, double y) { return x + y; };
    auto mul = [](double x, double y) { return x * y; };
    CHECK_ALL_NEAR(vals(r1), ref_binary(D(a31), {3, 1}, D(b4), {4}, add), F32);
    CHECK_ALL_NEAR(vals(r2), ref_binary(D(c234), {2, 3, 4}, D(d31), {3, 1}, mul), F32);
    CHECK_ALL_NEAR(vals(r3), ref_binary(D(e14), {1, 4}, D(a31), {3, 1}, [](double x, double y) { return x - y; }), F32);
    CHECK_ALL_NEAR(vals(r4), ref_unary(D(f), [](double x) { return 2.5 * x; }), F32);
    CHECK_ALL_NEAR(vals(r5), ref_binary(D(c234), {2, 3, 4}, D(b4), {4}, [](double x, double y) { return x / (y + 3); }), F32);
    CHECK_ALL_NEAR(vals(r6), ref_binary(D(c234), {2, 3, 4}, D(a31), {3, 1}, [](double x, double y) { return std::max(x, y); }), 0);
}

// =============================================================================== reductions

TEST(ops_reduce_sum_mean) {
    std::vector<float> xv = randf(60, 71, -2, 2);
    Shape s = {3, 4, 5};
    Tensor x = Tensor::from_vector(xv, s);
    Vec X = D(xv);
    struct R { Tensor t; Shape shape; Vec want; };
    std::vector<R> rs = {
        {x.sum(), {}, ref_reduce(X, s, {0, 1, 2}, Red::SUM)},
        {x.sum(0), {4, 5}, ref_reduce(X, s, {0}, Red::SUM)},
        {x.sum(1, true), {3, 1, 5}, ref_reduce(X, s, {1}, Red::SUM)},
        {x.sum(-1), {3, 4}, ref_reduce(X, s, {2}, Red::SUM)},
        {x.sum(std::vector<int>{0, 2}), {4}, ref_reduce(X, s, {0, 2}, Red::SUM)},
        {x.sum({-1, 0}, true), {1, 4, 1}, ref_reduce(X, s, {0, 2}, Red::SUM)},
        {x.mean(), {}, ref_reduce(X, s, {0, 1, 2}, Red::MEAN)},
        {x.mean(1), {3, 5}, ref_reduce(X, s, {1}, Red::MEAN)},
        {x.mean(-3, true), {1, 4, 5}, ref_reduce(X, s, {0}, Red::MEAN)},
        {x.mean({1, 2}), {3}, ref_reduce(X, s, {1, 2}, Red::MEAN)},
        {x.mean({0, 1}, true), {1, 1, 5}, ref_reduce(X, s, {0, 1}, Red::MEAN)},
    };
    std::vector<Tensor> outs;
    for (auto& r : rs) outs.push_back(r.t);
    tg::realize(outs);
    for (size_t k = 0; k < rs.size(); k++) {
        CHECK(rs[k].t.shape() == rs[k].shape);
        CHECK(rs[k].t.dtype() == DType::FLOAT32);
        CHECK_ALL_NEAR(vals(rs[k].t), rs[k].want, F32);
    }
    CHECK_NEAR(rs[0].t.item(), ref_reduce(X, s, {0, 1, 2}, Red::SUM)[0], F32);
}

TEST(ops_reduce_prod) {
    // along each axis of [3, 4, 5] (5 and 3 are no powers of two), with zeros and negatives
    std::vector<float> xv = randf(60, 76, -1.5, 1.5);
    xv[7] = 0;
    Shape s = {3, 4, 5};
    Tensor x = Tensor::from_vector(xv, s);
    for (int axis = 0; axis < 3; axis++) {
        Shape kept = s;
        kept[size_t(axis)] = 1;
        Vec want(size_t(count(kept)), 1.0);
        for (int64_t i = 0; i < 60; i++) {
            int64_t at[] = {i / 20, i / 5 % 4, i % 5};
            at[axis] = 0;
            want[size_t((at[0] * kept[1] + at[1]) * kept[2] + at[2])] *= xv[size_t(i)];
        }
        Tensor p = x.prod(axis, true);
        CHECK(p.shape() == kept);
        CHECK_ALL_NEAR(vals(p), want, F32);
        CHECK_ALL_NEAR(vals(x.prod(axis - 3)), want, F32);   // the axis dropped
    }
    CHECK(x.prod(1).shape() == S({3, 5}));
    double all = 1;
    for (size_t i = 0; i < 12; i++) all *= xv[i + 1];
    CHECK_NEAR(x.flatten().slice(0, 1, 13).prod().item(), all, F32);
    // integers multiply in int64, as PyTorch's; over nothing the product is 1
    Tensor big = Tensor::from_vector(std::vector<int32_t>{100000, 100000, -3}).prod();
    CHECK(big.dtype() == DType::INT64 && big.shape() == S({}));
    CHECK_EQ(big.to_vector<int64_t>()[0], int64_t(-30000000000));
    CHECK_ALL_NEAR(vals(Tensor::zeros({2, 0}).prod(1)), (Vec{1, 1}), 0);
    CHECK_THROWS(x.prod(3), "prod", "axis 3", "[3,4,5]");
}

TEST(ops_reduce_max_min) {
    std::vector<float> xv = randf(60, 72, -2, 2);
    Shape s = {3, 4, 5};
    Tensor x = Tensor::from_vector(xv, s);
    Vec X = D(xv);
    struct R { Tensor t; Shape shape; Vec want; };
    std::vector<R> rs = {
        {x.max(), {}, ref_reduce(X, s, {0, 1, 2}, Red::MAX)},
        {x.max(0), {4, 5}, ref_reduce(X, s, {0}, Red::MAX)},
        {x.max(-2, true), {3, 1, 5}, ref_reduce(X, s, {1}, Red::MAX)},
        {x.max(std::vector<int>{0, 2}), {4}, ref_reduce(X, s, {0, 2}, Red::MAX)},
        {x.min(), {}, ref_reduce(X, s, {0, 1, 2}, Red::MIN)},
        {x.min(2), {3, 4}, ref_reduce(X, s, {2}, Red::MIN)},
        {x.min(1, true), {3, 1, 5}, ref_reduce(X, s, {1}, Red::MIN)},
        {x.min({-1, -2}, true), {3, 1, 1}, ref_reduce(X, s, {1, 2}, Red::MIN)},
    };
    std::vector<Tensor> outs;
    for (auto& r : rs) outs.push_back(r.t);
    tg::realize(outs);
    for (size_t k = 0; k < rs.size(); k++) {
        CHECK(rs[k].t.shape() == rs[k].shape);
        CHECK_ALL_NEAR(vals(rs[k].t), rs[k].want, 0);
    }
    // all-negative input: the max is not 0 (the identity must be -inf, not 0)
    Tensor neg = Tensor::from_vector(std::vector<float>{-3, -1.5f, -2});
    Tensor pos = Tensor::from_vector(std::vector<float>{3, 1.5f, 2});
    Tensor nm = neg.max(), pm = pos.min();
    tg::realize({nm, pm});
    CHECK_EQ(nm.item(), -1.5);
    CHECK_EQ(pm.item(), 1.5);
}

TEST(ops_reduce_axis_list_braces) {
    // PyTorch users write x.sum({0, 2}); it must pick the list-of-axes overload
    CHECK(sum_list_ok<Tensor>(0));
    CHECK(max_list_ok<Tensor>(0));
}

TEST(ops_reduce_int_and_double) {
    std::vector<int32_t> iv = randi(24, 73, -50, 50);
    Tensor i = Tensor::from_vector(iv, {4, 6});
    std::vector<double> dv = randd(24, 74, -1, 1);
    Tensor d = Tensor::from_vector(dv, {4, 6});
    Tensor is = i.sum(1), im = i.max(0), imn = i.min(), imean = i.mean(1), ds = d.sum(0), dm = d.mean();
    CHECK(is.dtype() == DType::INT64);       // integers sum in int64, as in PyTorch
    CHECK(im.dtype() == DType::INT32);
    CHECK(imn.dtype() == DType::INT32);
    CHECK(imean.dtype() == DType::FLOAT32);
    CHECK(ds.dtype() == DType::FLOAT64);
    CHECK(dm.dtype() == DType::FLOAT64);
    tg::realize({is, im, imn, imean, ds, dm});
    Vec I = D(iv);
    CHECK_ALL_NEAR(vals(is), ref_reduce(I, {4, 6}, {1}, Red::SUM), 0);
    CHECK_ALL_NEAR(vals(im), ref_reduce(I, {4, 6}, {0}, Red::MAX), 0);
    CHECK_ALL_NEAR(vals(imn), ref_reduce(I, {4, 6}, {0, 1}, Red::MIN), 0);
    CHECK_ALL_NEAR(vals(imean), ref_reduce(I, {4, 6}, {1}, Red::MEAN), F32);
    CHECK_ALL_NEAR(vals(ds), ref_reduce(dv, {4, 6}, {0}, Red::SUM), F64);
    CHECK_ALL_NEAR(vals(dm), ref_reduce(dv, {4, 6}, {0, 1}, Red::MEAN), F64);
}

TEST(ops_reduce_large_sum) {
    std::vector<float> xv = randf(4096, 75, 0, 1);
    Tensor x = Tensor::from_vector(xv, {64, 64});
    Tensor all = x.sum(), rows = x.sum(1), m = x.mean();
    tg::realize({all, rows, m});
    Vec X = D(xv);
    CHECK_NEAR(all.item(), ref_reduce(X, {64, 64}, {0, 1}, Red::SUM)[0], 1e-5);
    CHECK_ALL_NEAR(vals(rows), ref_reduce(X, {64, 64}, {1}, Red::SUM), F32);
    CHECK_NEAR(m.item(), ref_reduce(X, {64, 64}, {0, 1}, Red::MEAN)[0], F32);
}

TEST(ops_argmax) {
    // ties: the first maximum wins
    std::vector<float> xv = {1, 3, 3, 0, 5, 5, 0, 5, 2, 1, 2, -1};
    Tensor x = Tensor::from_vector(xv, {3, 4});
    Tensor all = x.argmax(), a0 = x.argmax(0), a1 = x.argmax(1), a1k = x.argmax(-1, true);
    Tensor a0k = x.argmax(0, true);
    CHECK(all.dtype() == DType::INT64);   // as PyTorch
    CHECK(a1.dtype() == DType::INT64);
    CHECK(all.shape() == S({}));
    CHECK(a0.shape() == S({4}));
    CHECK(a1.shape() == S({3}));
    CHECK(a1k.shape() == S({3, 1}));
    CHECK(a0k.shape() == S({1, 4}));
    tg::realize({all, a0, a1, a1k, a0k});
    CHECK_EQ(all.item(), 4.0);   // flat index of the first 5
    // reference by loops
    std::vector<int> w0(4), w1(3);
    for (int j = 0; j < 4; j++)
        for (int i = 1; i < 3; i++)
            if (xv[size_t(i * 4 + j)] > xv[size_t(w0[size_t(j)] * 4 + j)]) w0[size_t(j)] = i;
    for (int i = 0; i < 3; i++)
        for (int j = 1; j < 4; j++)
            if (xv[size_t(i * 4 + j)] > xv[size_t(i * 4 + w1[size_t(i)])]) w1[size_t(i)] = j;
    CHECK_ALL_NEAR(ivals(a0), w0, 0);
    CHECK_ALL_NEAR(ivals(a1), w1, 0);
    CHECK_ALL_NEAR(ivals(a1k), w1, 0);
    CHECK_ALL_NEAR(ivals(a0k), w0, 0);
    // random data, 3-D, middle axis; int32 input
    std::vector<float> rv = randf(60, 76);
    Tensor r = Tensor::from_vector(rv, {3, 4, 5});
    Tensor ri = Tensor::from_vector(std::vector<int32_t>{4, -2, 9, 9, 1});
    Tensor am = r.argmax(1), ai = ri.argmax();
    tg::realize({am, ai});
    std::vector<int> wm;
    for (int a = 0; a < 3; a++)
        for (int c = 0; c < 5; c++) {
            int best = 0;
            for (int b = 1; b < 4; b++)
                if (rv[size_t((a * 4 + b) * 5 + c)] > rv[size_t((a * 4 + best) * 5 + c)]) best = b;
            wm.push_back(best);
        }
    CHECK(am.shape() == S({3, 5}));
    CHECK_ALL_NEAR(ivals(am), wm, 0);
    CHECK_EQ(ai.item(), 2.0);
}

// =============================================================================== movement

TEST(ops_reshape_view) {
    std::vector<float> xv = randf(24, 81);
    Tensor x = Tensor::from_vector(xv, {2, 3, 4});
    Tensor r1 = x.reshape({4, -1}), r2 = x.view({-1}), r3 = x.reshape({3, 8}).reshape({2, 12}),
           r4 = x.reshape({2, 1, 12, 1});
    CHECK(r1.shape() == S({4, 6}));
    CHECK(r2.shape() == S({24}));
    CHECK(r3.shape() == S({2, 12}));
    CHECK(r4.shape() == S({2, 1, 12, 1}));
    Tensor s1 = r1 + 0, s3 = r3 * 1, s4 = r4 + 0;
    tg::realize({s1, s3, s4});
    CHECK_ALL_NEAR(vals(s1), D(xv), 0);
    CHECK_ALL_NEAR(vals(r2), D(xv), 0);
    CHECK_ALL_NEAR(vals(s3), D(xv), 0);
    CHECK_ALL_NEAR(vals(s4), D(xv), 0);
}

TEST(ops_permute_transpose) {
    std::vector<float> xv = randf(24, 82);
    Shape s = {2, 3, 4};
    Tensor x = Tensor::from_vector(xv, s);
    Vec X = D(xv);
    Shape ps, ts, t02s, pns;
    Vec p = ref_permute(X, s, {2, 0, 1}, &ps), t = ref_permute(X, s, {0, 2, 1}, &ts),
        t02 = ref_permute(X, s, {2, 1, 0}, &t02s), pn = ref_permute(X, s, {1, 2, 0}, &pns);
    Tensor tp = x.permute({2, 0, 1}), tt = x.transpose(), tt02 = x.transpose(0, 2), tpn = x.permute({-2, -1, 0});
    tg::realize({tp, tt, tt02, tpn});
    CHECK(tp.shape() == ps);
    CHECK(tt.shape() == ts);
    CHECK(tt02.shape() == t02s);
    CHECK(tpn.shape() == pns);
    CHECK_ALL_NEAR(vals(tp), p, 0);
    CHECK_ALL_NEAR(vals(tt), t, 0);
    CHECK_ALL_NEAR(vals(tt02), t02, 0);
    CHECK_ALL_NEAR(vals(tpn), pn, 0);
    // a reshape of a permuted tensor, then a permute of that
    Tensor y = x.permute({1, 0, 2}).reshape({6, 4}).transpose();
    Shape s1;
    Vec p1 = ref_permute(X, s, {1, 0, 2}, &s1);
    Vec want = ref_permute(p1, {6, 4}, {1, 0}, nullptr);
    CHECK(y.shape() == S({4, 6}));
    CHECK_ALL_NEAR(vals(y), want, 0);
}

TEST(ops_expand) {
    std::vector<float> av = randf(3, 83), bv = randf(4, 84);
    Tensor a = Tensor::from_vector(av, {3, 1}), b = Tensor::from_vector(bv, {4});
    Tensor e1 = a.expand({3, 4}), e2 = b.expand({2, 3, 4}), e3 = a.expand({2, -1, 5});
    tg::realize({e1, e2, e3});
    CHECK(e1.shape() == S({3, 4}));
    CHECK(e2.shape() == S({2, 3, 4}));
    CHECK(e3.shape() == S({2, 3, 5}));
    Vec w1, w2, w3;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) w1.push_back(av[size_t(i)]);
    for (int k = 0; k < 6; k++)
        for (int j = 0; j < 4; j++) w2.push_back(bv[size_t(j)]);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) w3.push_back(av[size_t(i)]);
    CHECK_ALL_NEAR(vals(e1), w1, 0);
    CHECK_ALL_NEAR(vals(e2), w2, 0);
    CHECK_ALL_NEAR(vals(e3), w3, 0);
}

TEST(ops_pad_shrink) {
    std::vector<float> xv = randf(12, 85);
    Tensor x = Tensor::from_vector(xv, {3, 4});
    Tensor p0 = x.pad({{1, 2}, {0, 1}}), p9 = x.pad({{0, 1}, {2, 0}}, 9.5), s = x.shrink({{1, 3}, {1, 4}});
    Tensor pi = Tensor::from_vector(std::vector<int32_t>{1, 2, 3}).pad({{2, 1}}, -4);
    tg::realize({p0, p9, s, pi});
    CHECK(p0.shape() == S({6, 5}));
    CHECK(p9.shape() == S({4, 6}));
    CHECK(s.shape() == S({2, 3}));
    CHECK(pi.dtype() == DType::INT32);
    Vec w0, w9, ws;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 5; j++) {
            int si = i - 1, sj = j;
            w0.push_back(si >= 0 && si < 3 && sj < 4 ? double(xv[size_t(si * 4 + sj)]) : 0.0);
        }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
            int si = i, sj = j - 2;
            w9.push_back(si < 3 && sj >= 0 ? double(xv[size_t(si * 4 + sj)]) : 9.5);
        }
    for (int i = 1; i < 3; i++)
        for (int j = 1; j < 4; j++) ws.push_back(xv[size_t(i * 4 + j)]);
    CHECK_ALL_NEAR(vals(p0), w0, 0);
    CHECK_ALL_NEAR(vals(p9), w9, 0);
    CHECK_ALL_NEAR(vals(s), ws, 0);
    CHECK_ALL_NEAR(vals(pi), (Vec{-4, -4, 1, 2, 3, -4}), 0);
}

TEST(ops_slice) {
    std::vector<float> xv = randf(42, 86);
    Tensor x = Tensor::from_vector(xv, {6, 7});
    auto ref = [&](int axis, int64_t b, int64_t e, int64_t step) {
        Vec out;
        for (int64_t i = 0; i < 6; i++)
            for (int64_t j = 0; j < 7; j++) {
                int64_t k = axis == 0 ? i : j;
                if (k >= b && k < e && (k - b) % step == 0) out.push_back(xv[size_t(i * 7 + j)]);
            }
        return out;
    };
    Tensor s1 = x.slice(0, 1, 4), s2 = x.slice(1, 0, 7, 2), s3 = x.slice(1, 1, 6, 3),
           s4 = x.slice(0, -2, 6), s5 = x.slice(1, -5, -1, 2), s6 = x.slice(0, 0, 6, 4),
           s7 = x.slice(1, 2, 3);
    tg::realize({s1, s2, s3, s4, s5, s6, s7});
    CHECK(s1.shape() == S({3, 7}));
    CHECK(s2.shape() == S({6, 4}));
    CHECK(s3.shape() == S({6, 2}));
    CHECK(s4.shape() == S({2, 7}));
    CHECK(s5.shape() == S({6, 2}));
    CHECK(s6.shape() == S({2, 7}));
    CHECK(s7.shape() == S({6, 1}));
    CHECK_ALL_NEAR(vals(s1), ref(0, 1, 4, 1), 0);
    CHECK_ALL_NEAR(vals(s2), ref(1, 0, 7, 2), 0);
    CHECK_ALL_NEAR(vals(s3), ref(1, 1, 6, 3), 0);
    CHECK_ALL_NEAR(vals(s4), ref(0, 4, 6, 1), 0);
    CHECK_ALL_NEAR(vals(s5), ref(1, 2, 6, 2), 0);
    CHECK_ALL_NEAR(vals(s6), ref(0, 0, 6, 4), 0);
    CHECK_ALL_NEAR(vals(s7), ref(1, 2, 3, 1), 0);
    // bounds beyond the axis are clamped as Python's x[a:b:c] clamps them (x has 6 rows, 7
    // columns): x[0:100] is every row, x[-100:2] the first 2, x[4:2] and x[9:12] none,
    // x[:, 5:100:2] column 5 alone, x[:, -100:-4:2] columns 0 and 2
    Tensor c1 = x.slice(0, 0, 100), c2 = x.slice(0, -100, 2), c3 = x.slice(0, 4, 2),
           c4 = x.slice(0, 9, 12), c5 = x.slice(1, 5, 100, 2), c6 = x.slice(1, -100, -4, 2),
           c7 = x.slice(0, 4, 2, 3);
    CHECK(c1.shape() == S({6, 7}));
    CHECK(c2.shape() == S({2, 7}));
    CHECK(c3.shape() == S({0, 7}));
    CHECK(c4.shape() == S({0, 7}));
    CHECK(c5.shape() == S({6, 1}));
    CHECK(c6.shape() == S({6, 2}));
    CHECK(c7.shape() == S({0, 7}));
    tg::realize({c1, c2, c5, c6});
    CHECK_ALL_NEAR(vals(c1), ref(0, 0, 6, 1), 0);
    CHECK_ALL_NEAR(vals(c2), ref(0, 0, 2, 1), 0);
    CHECK_ALL_NEAR(vals(c5), ref(1, 5, 6, 2), 0);
    CHECK_ALL_NEAR(vals(c6), ref(1, 0, 3, 2), 0);
    CHECK(vals(c3).empty() && vals(c7).empty());
    // x[i] drops the first axis; negative i counts from the end
    Tensor r1 = x[1], rl = x[-1];
    tg::realize({r1, rl});
    CHECK(r1.shape() == S({7}));
    CHECK_ALL_NEAR(vals(r1), ref(0, 1, 2, 1), 0);
    CHECK_ALL_NEAR(vals(rl), ref(0, 5, 6, 1), 0);
}

TEST(ops_flip) {
    std::vector<float> xv = randf(24, 87);
    Tensor x = Tensor::from_vector(xv, {2, 3, 4});
    Tensor f0 = x.flip(0), f2 = x.flip(-1), f12 = x.flip({1, 2});
    tg::realize({f0, f2, f12});
    Vec w0, w2, w12;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) {
                w0.push_back(xv[size_t(((1 - a) * 3 + b) * 4 + c)]);
                w2.push_back(xv[size_t((a * 3 + b) * 4 + (3 - c))]);
                w12.push_back(xv[size_t((a * 3 + (2 - b)) * 4 + (3 - c))]);
            }
    CHECK(f12.shape() == S({2, 3, 4}));
    CHECK_ALL_NEAR(vals(f0), w0, 0);
    CHECK_ALL_NEAR(vals(f2), w2, 0);
    CHECK_ALL_NEAR(vals(f12), w12, 0);
}

TEST(ops_squeeze_unsqueeze_flatten_contiguous) {
    std::vector<float> xv = randf(12, 88);
    Tensor x = Tensor::from_vector(xv, {1, 3, 1, 4});
    CHECK(x.squeeze().shape() == S({3, 4}));
    CHECK(x.squeeze(0).shape() == S({3, 1, 4}));
    CHECK(x.squeeze(-2).shape() == S({1, 3, 4}));
    CHECK(x.squeeze(1).shape() == S({1, 3, 1, 4}));   // size 3: unchanged, like PyTorch
    CHECK(x.unsqueeze(0).shape() == S({1, 1, 3, 1, 4}));
    CHECK(x.unsqueeze(-1).shape() == S({1, 3, 1, 4, 1}));
    CHECK(x.unsqueeze(2).shape() == S({1, 3, 1, 1, 4}));
    CHECK(x.flatten().shape() == S({12}));
    CHECK(x.flatten(1, 2).shape() == S({1, 3, 4}));
    CHECK(x.flatten(-2).shape() == S({1, 3, 4}));
    Tensor t = Tensor::from_vector(xv, {3, 4});
    Tensor c = t.transpose().contiguous(), sq = x.squeeze(), fl = t.transpose().flatten();
    Tensor cc = c + 1;
    tg::realize({c, sq, fl, cc});
    Vec tr = ref_permute(D(xv), {3, 4}, {1, 0}, nullptr);
    CHECK(c.shape() == S({4, 3}));
    CHECK_ALL_NEAR(vals(c), tr, 0);
    CHECK_ALL_NEAR(vals(sq), D(xv), 0);
    CHECK_ALL_NEAR(vals(fl), tr, 0);
    CHECK_ALL_NEAR(vals(cc), ref_unary(tr, [](double v) { return v + 1; }), F32);
}

TEST(ops_cat_stack) {
    std::vector<float> av = randf(6, 89), bv = randf(4, 90), cv = randf(6, 91);
    Tensor a = Tensor::from_vector(av, {2, 3}), b = Tensor::from_vector(bv, {2, 2}),
           c = Tensor::from_vector(cv, {2, 3});
    Tensor c1 = tg::cat({a, b, c}, 1), c0 = tg::cat({a, c}, 0), cn = tg::cat({a, c, a}, -2);
    Tensor st0 = tg::stack({a, c}), st1 = tg::stack({a, c}, 1), stl = tg::stack({a, c}, -1);
    Tensor mixed = tg::cat({Tensor::from_vector(std::vector<int32_t>{1, 2}), Tensor::from_vector(std::vector<float>{0.5f, 4})});
    tg::realize({c1, c0, cn, st0, st1, stl, mixed});
    CHECK(c1.shape() == S({2, 8}));
    CHECK(c0.shape() == S({4, 3}));
    CHECK(cn.shape() == S({6, 3}));
    CHECK(st0.shape() == S({2, 2, 3}));
    CHECK(st1.shape() == S({2, 2, 3}));
    CHECK(stl.shape() == S({2, 3, 2}));
    CHECK(mixed.dtype() == DType::FLOAT32);
    Vec w1, w0, wn, ws0, ws1, wsl;
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 3; j++) w1.push_back(av[size_t(i * 3 + j)]);
        for (int j = 0; j < 2; j++) w1.push_back(bv[size_t(i * 2 + j)]);
        for (int j = 0; j < 3; j++) w1.push_back(cv[size_t(i * 3 + j)]);
    }
    w0 = D(av);
    w0.insert(w0.end(), cv.begin(), cv.end());
    wn = w0;
    wn.insert(wn.end(), av.begin(), av.end());
    ws0 = w0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++) ws1.push_back(k == 0 ? av[size_t(i * 3 + j)] : cv[size_t(i * 3 + j)]);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) wsl.push_back(k == 0 ? av[size_t(i * 3 + j)] : cv[size_t(i * 3 + j)]);
    CHECK_ALL_NEAR(vals(c1), w1, 0);
    CHECK_ALL_NEAR(vals(c0), w0, 0);
    CHECK_ALL_NEAR(vals(cn), wn, 0);
    CHECK_ALL_NEAR(vals(st0), ws0, 0);
    CHECK_ALL_NEAR(vals(st1), ws1, 0);
    CHECK_ALL_NEAR(vals(stl), wsl, 0);
    CHECK_ALL_NEAR(vals(mixed), (Vec{1, 2, 0.5, 4}), 0);
}

// =============================================================================== matmul, einsum

TEST(ops_matmul_shapes) {
    std::vector<float> v3 = randf(3, 101), v4 = randf(4, 102), m34 = randf(12, 103), m45 = randf(20, 104),
                       b234 = randf(24, 105), b2134 = randf(24, 106), b542 = randf(40, 107);
    Tensor V3 = Tensor::from_vector(v3), V4 = Tensor::from_vector(v4), V3b = Tensor::from_vector(randf(3, 108)),
           M34 = Tensor::from_vector(m34, {3, 4}), M45 = Tensor::from_vector(m45, {4, 5}),
           B234 = Tensor::from_vector(b234, {2, 3, 4}), B2134 = Tensor::from_vector(b2134, {2, 1, 3, 4}),
           B542 = Tensor::from_vector(b542, {5, 4, 2});
    Tensor dot = V3.matmul(V3b), vm = V3.matmul(M34), mv = M34.matmul(V4), mm = M34.matmul(M45),
           bm = B234.matmul(M45), bb = B2134.matmul(B542);
    CHECK(dot.shape() == S({}));
    CHECK(vm.shape() == S({4}));
    CHECK(mv.shape() == S({3}));
    CHECK(mm.shape() == S({3, 5}));
    CHECK(bm.shape() == S({2, 3, 5}));
    CHECK(bb.shape() == S({2, 5, 3, 2}));
    tg::realize({dot, vm, mv, mm, bm, bb});
    Vec v3b = vals(V3b);
    CHECK_ALL_NEAR(vals(dot), ref_matmul(D(v3), {1, 3}, v3b, {3, 1}, nullptr), F32);
    CHECK_ALL_NEAR(vals(vm), ref_matmul(D(v3), {1, 3}, D(m34), {3, 4}, nullptr), F32);
    CHECK_ALL_NEAR(vals(mv), ref_matmul(D(m34), {3, 4}, D(v4), {4, 1}, nullptr), F32);
    CHECK_ALL_NEAR(vals(mm), ref_matmul(D(m34), {3, 4}, D(m45), {4, 5}, nullptr), F32);
    CHECK_ALL_NEAR(vals(bm), ref_matmul(D(b234), {2, 3, 4}, D(m45), {4, 5}, nullptr), F32);
    Shape os;
    Vec wbb = ref_matmul(D(b2134), {2, 1, 3, 4}, D(b542), {5, 4, 2}, &os);
    CHECK(os == S({2, 5, 3, 2}));
    CHECK_ALL_NEAR(vals(bb), wbb, F32);
}

// PyTorch's other names for products, transposes and copies, against double references
TEST(ops_mm_bmm_t_mT_square_clone) {
    std::vector<float> m34 = randf(12, 111), m45 = randf(20, 112), b234 = randf(24, 113),
                       b245 = randf(40, 114);
    Tensor M34 = Tensor::from_vector(m34, {3, 4}), M45 = Tensor::from_vector(m45, {4, 5}),
           B234 = Tensor::from_vector(b234, {2, 3, 4}), B245 = Tensor::from_vector(b245, {2, 4, 5});
    Tensor mm = M34.mm(M45), bmm = B234.bmm(B245), t = M34.t(), mt = B234.mT();
    Tensor sq = M34.square(), cl = M34.clone();
    tg::realize({mm, bmm, t, mt, sq, cl});
    CHECK(mm.shape() == S({3, 5}) && bmm.shape() == S({2, 3, 5}));
    CHECK(t.shape() == S({4, 3}) && mt.shape() == S({2, 4, 3}));
    CHECK_ALL_NEAR(vals(mm), ref_matmul(D(m34), {3, 4}, D(m45), {4, 5}, nullptr), F32);
    CHECK_ALL_NEAR(vals(bmm), ref_matmul(D(b234), {2, 3, 4}, D(b245), {2, 4, 5}, nullptr), F32);
    Vec wt, wmt, wsq;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 3; i++) wt.push_back(m34[size_t(i * 4 + j)]);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 3; i++) wmt.push_back(b234[size_t(b * 12 + i * 4 + j)]);
    for (float v : m34) wsq.push_back(double(v) * v);
    CHECK_ALL_NEAR(vals(t), wt, 0);
    CHECK_ALL_NEAR(vals(mt), wmt, 0);
    CHECK_ALL_NEAR(vals(sq), wsq, F32);
    CHECK_ALL_NEAR(vals(cl), D(m34), 0);
    CHECK(cl.realized() && M34.realized());
    Tensor v = Tensor::from_vector({1.f, 2.f});
    CHECK(v.t().shape() == S({2}));
    CHECK(Tensor::from_vector({true, false}).square().dtype() == DType::INT64);
    CHECK(Tensor::from_vector({3, -4}).square().to_vector<int64_t>() == (std::vector<int64_t>{9, 16}));
    CHECK(M34.size() == S({3, 4}) && M34.dim() == 2 && B234.dim() == 3);
    CHECK_THROWS(M34.mm(B245), "mm", "[3,4]", "[2,4,5]", "2 axes");
    CHECK_THROWS(B234.bmm(M45), "bmm", "[2,3,4]", "[4,5]");
    CHECK_THROWS(B234.bmm(Tensor::zeros({3, 4, 5})), "bmm", "same batch");
    CHECK_THROWS(B234.t(), "t:", "[2,3,4]", "mT");
    CHECK_THROWS(v.mT(), "mT", "[2]");
}

// clamp/clip, masked_fill, argmin, var/std, repeat, split/chunk, linspace against double
TEST(ops_clamp_masked_fill_argmin_var_std) {
    std::vector<float> xv = randf(24, 121, -3, 3);
    xv[5] = NAN;
    Tensor x = Tensor::from_vector(xv, {4, 6});
    Tensor c = x.clamp(-1.0, 2.0), lo = x.clamp(0.5), hi = x.clip(std::nullopt, -0.5);
    Tensor swapped = x.clamp(1.0, -1.0);   // min > max: every value is max, as in PyTorch
    Tensor m = x.masked_fill(x > 1.0, -9.0);
    tg::realize({c, lo, hi, swapped, m});
    Vec wc, wlo, whi, wm;
    for (float v : xv) {
        double d = v;
        wc.push_back(std::isnan(d) ? d : std::min(std::max(d, -1.0), 2.0));
        wlo.push_back(std::isnan(d) ? d : std::max(d, 0.5));
        whi.push_back(std::isnan(d) ? d : std::min(d, -0.5));
        wm.push_back(d > 1 ? -9.0 : d);
    }
    CHECK_ALL_NEAR(vals(c), wc, 0);
    CHECK_ALL_NEAR(vals(lo), wlo, 0);
    CHECK_ALL_NEAR(vals(hi), whi, 0);
    CHECK_ALL_NEAR(vals(m), wm, 0);
    for (size_t i = 0; i < xv.size(); i++)
        if (i != 5) CHECK_EQ(vals(swapped)[i], -1.0);
    CHECK_THROWS(x.masked_fill(x, 0.0), "masked_fill", "float32", "bool");
    Tensor mi = Tensor::from_vector({1, 2, 3}).masked_fill(Tensor::from_vector({true, false, true}),
                                                           2.5);   // x's dtype, as PyTorch
    CHECK(mi.dtype() == DType::INT32);
    CHECK(mi.to_vector<int64_t>() == (std::vector<int64_t>{2, 2, 2}));
    // argmin: the first minimum; a NaN is the minimum (the first NaN), as in PyTorch
    std::vector<float> yv = {3, 1, 2, 1, 5, 0, 0, 7, 4, 4, 4, 4};
    Tensor y = Tensor::from_vector(yv, {3, 4});
    CHECK(y.argmin(1).to_vector<int64_t>() == (std::vector<int64_t>{1, 1, 0}));
    CHECK(y.argmin(0).to_vector<int64_t>() == (std::vector<int64_t>{0, 1, 1, 0}));
    CHECK_EQ(y.argmin().item(), 5);
    CHECK(x.argmin(1).to_vector<int64_t>()[0] == 5);
    Tensor yi = Tensor::from_vector(std::vector<int32_t>{5, -2147483647 - 1, 7});
    CHECK_EQ(yi.argmin().item(), 1);   // no wrap-around in -x
    // var and std with correction (Bessel's by default) and keepdim, over an axis and all
    std::vector<double> zv = th::randd(30, 122, -2, 2);
    Tensor z = Tensor::from_vector(zv, {5, 6});
    auto var_ref = [&](int axis, int64_t correction) {
        Vec out;
        int n = axis == 0 ? 5 : 6, m_ = axis == 0 ? 6 : 5;
        for (int j = 0; j < m_; j++) {
            auto at = [&](int i) { return axis == 0 ? zv[size_t(i * 6 + j)] : zv[size_t(j * 6 + i)]; };
            double mean = 0, ss = 0;
            for (int i = 0; i < n; i++) mean += at(i) / n;
            for (int i = 0; i < n; i++) ss += (at(i) - mean) * (at(i) - mean);
            out.push_back(ss / double(n - correction));
        }
        return out;
    };
    CHECK_ALL_NEAR(vals(z.var(0)), var_ref(0, 1), F64);
    CHECK_ALL_NEAR(vals(z.var(1, 0)), var_ref(1, 0), F64);
    Vec sd = var_ref(1, 1);
    for (double& v : sd) v = std::sqrt(v);
    CHECK_ALL_NEAR(vals(z.std(1)), sd, F64);
    CHECK(z.var(1, 1, true).shape() == S({5, 1}));
    double mean = 0, ss = 0;
    for (double v : zv) mean += v / 30;
    for (double v : zv) ss += (v - mean) * (v - mean);
    CHECK_NEAR(z.var().item(), ss / 29, F64);
    CHECK_NEAR(z.std(std::vector<int>{0, 1}, 0).item(), std::sqrt(ss / 30), F64);
    CHECK(std::isnan(Tensor::from_vector({2.f}).var().item()));   // one value, correction 1
    CHECK(Tensor::from_vector({1, 2, 3, 4}).var().dtype() == DType::FLOAT32);
    CHECK_NEAR(Tensor::from_vector({1, 2, 3, 4}).var().item(), 5.0 / 3, F32);
}

TEST(ops_repeat_split_chunk_linspace) {
    Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
    Tensor r = x.repeat({2, 2}), r3 = x.repeat({2, 1, 1});
    CHECK(r.shape() == S({4, 6}) && r3.shape() == S({2, 2, 3}));
    CHECK_ALL_NEAR(vals(r), (Vec{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6,
                                 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}), 0);
    CHECK_ALL_NEAR(vals(r3), (Vec{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}), 0);
    CHECK_THROWS(x.repeat({2}), "repeat", "[2,3]");
    std::vector<Tensor> c = x.chunk(2, 1), sp = x.split(2, 1), sz = x.split({1, 2}, 1);
    CHECK(c.size() == 2 && c[0].shape() == S({2, 2}) && c[1].shape() == S({2, 1}));
    CHECK(sp.size() == 2 && sp[0].shape() == S({2, 2}) && sp[1].shape() == S({2, 1}));
    CHECK(sz.size() == 2 && sz[0].shape() == S({2, 1}) && sz[1].shape() == S({2, 2}));
    CHECK_ALL_NEAR(vals(c[0]), (Vec{1, 2, 4, 5}), 0);
    CHECK_ALL_NEAR(vals(c[1]), (Vec{3, 6}), 0);
    CHECK_ALL_NEAR(vals(sz[1]), (Vec{2, 3, 5, 6}), 0);
    CHECK(Tensor::zeros({5}).chunk(3).size() == 3);    // pieces of 2, 2, 1
    CHECK(Tensor::zeros({6}).chunk(4).size() == 3);    // pieces of 2: fewer than asked
    CHECK_THROWS(x.split({1, 1}, 1), "split", "sum to 2", "[2,3]");
    CHECK_THROWS(x.chunk(0), "chunk", "positive");
    for (auto [a, b, n] : {std::tuple{0.0, 1.0, 5}, {-2.0, 3.5, 12}, {3.0, -1.0, 7}}) {
        Tensor l = Tensor::linspace(a, b, n);
        CHECK(l.shape() == S({n}) && l.dtype() == DType::FLOAT32);
        Vec want;
        for (int i = 0; i < n; i++) want.push_back(a + (b - a) * i / (n - 1));
        CHECK_ALL_NEAR(vals(l), want, 1e-6);
        CHECK_EQ(vals(l)[0], double(float(a)));
        CHECK_EQ(vals(l)[size_t(n - 1)], double(float(b)));
    }
    CHECK_ALL_NEAR(vals(Tensor::linspace(2, 9, 1)), (Vec{2}), 0);
    CHECK(Tensor::linspace(0, 1, 0).shape() == S({0}));
}

// log1p and expm1 keep their relative accuracy near 0, where log(1 + x) and exp(x) - 1 lose it
TEST(ops_log1p_expm1) {
    std::vector<double> xs = {0, 1e-30, -1e-12, 1e-8, -3e-5, 1e-3, 0.1, -0.3, 0.49, 0.5, -0.5,
                              0.75, 2, -0.9, 30, -20};
    std::vector<float> xf(xs.begin(), xs.end());
    for (bool f64 : {false, true}) {
        Tensor x = f64 ? Tensor::from_vector(xs) : Tensor::from_vector(xf);
        Tensor l = x.log1p(), e = x.expm1();
        tg::realize({l, e});
        CHECK(l.dtype() == x.dtype() && e.dtype() == x.dtype());
        Vec lv = vals(l), ev = vals(e);
        double tol = f64 ? 1e-14 : 4e-7;
        for (size_t i = 0; i < xs.size(); i++) {
            double v = f64 ? xs[i] : double(xf[i]);
            double wl = std::log1p(v), we = std::expm1(v);
            // beyond |x| = 1 they are exp and log, as accurate as those (float32 exp(30): 1e-6)
            double far = std::fabs(v) > 1 && !f64 ? 4e-6 : tol;
            if (std::isnan(wl)) CHECK(std::isnan(lv[i]));   // log1p(-20)
            else CHECK(std::fabs(lv[i] - wl) <= far * std::fabs(wl));
            CHECK(std::fabs(ev[i] - we) <= far * std::fabs(we));
        }
    }
    Tensor edge = Tensor::from_vector({-1.f, -2.f, INFINITY, -INFINITY, NAN});
    Vec l = vals(edge.log1p()), e = vals(edge.expm1());
    CHECK(std::isinf(l[0]) && l[0] < 0 && std::isnan(l[1]) && std::isinf(l[2]) && std::isnan(l[4]));
    CHECK(std::isinf(e[2]) && e[3] == -1 && std::isnan(e[4]));
    CHECK(Tensor::from_vector({1, 2}).log1p().dtype() == DType::FLOAT32);
}

// randint: int64 in [low, high), every value drawn, the same values for the same seed
TEST(ops_randint) {
    Tensor r = Tensor::randint(-3, 4, {2000}, 11);
    CHECK(r.dtype() == DType::INT64 && r.shape() == S({2000}));
    std::vector<int64_t> v = r.to_vector<int64_t>();
    std::vector<int> count(7, 0);
    for (int64_t x : v) {
        CHECK(x >= -3 && x < 4);
        if (x >= -3 && x < 4) count[size_t(x + 3)]++;
    }
    for (int c : count) CHECK(c > 200 && c < 380);   // 2000 / 7 = 286 each on average
    CHECK(Tensor::randint(-3, 4, {2000}, 11).to_vector<int64_t>() == v);
    CHECK(Tensor::randint(-3, 4, {2000}, 12).to_vector<int64_t>() != v);
    std::vector<int64_t> big = Tensor::randint(0, int64_t(1) << 40, {64}, 5).to_vector<int64_t>();
    int64_t top = 0;
    for (int64_t x : big) {
        CHECK(x >= 0 && x < (int64_t(1) << 40));
        top = std::max(top, x);
    }
    CHECK(top > (int64_t(1) << 38));   // the high bits are drawn too
    CHECK_THROWS(Tensor::randint(4, 4, {2}), "randint", "low 4", "high 4");
    tg::nn::Identity id;
    CHECK_ALL_NEAR(vals(id(Tensor::from_vector({1.f, -2.f}))), (Vec{1, -2}), 0);
}

// randperm, multinomial and bernoulli: valid draws at the expected rates, the same for the same
// seed, and their errors (weights and p checked as the program runs)
TEST(ops_random_draws) {
    std::vector<int64_t> perm = Tensor::randperm(1000, 3).to_vector<int64_t>();
    CHECK(Tensor::randperm(1000, 3).dtype() == DType::INT64 && perm.size() == 1000);
    CHECK(Tensor::randperm(1000, 3).to_vector<int64_t>() == perm);
    CHECK(Tensor::randperm(1000, 4).to_vector<int64_t>() != perm);
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 1000; i++) CHECK_EQ(sorted[size_t(i)], i);
    int ascents = 0;   // 499.5 on average, standard deviation 9
    for (size_t i = 1; i < perm.size(); i++) ascents += perm[i] > perm[i - 1];
    CHECK(ascents > 450 && ascents < 550);
    CHECK(Tensor::randperm(0).shape() == S({0}));
    CHECK_THROWS(Tensor::randperm(-1), "randperm", "-1");

    // with replacement: rows of weights not summing to 1; a weight of 0 is never drawn
    Tensor weights = Tensor::from_vector({0.1f, 0.2f, 0.3f, 0.4f, 0.f, 0.f, 0.f, 0.f, 0.f, 5.f},
                                         {2, 5});
    Tensor drawn = weights.multinomial(20000, true, 5);
    CHECK(drawn.dtype() == DType::INT64 && drawn.shape() == S({2, 20000}));
    std::vector<int64_t> d = drawn.to_vector<int64_t>();
    std::vector<double> count(5, 0);
    for (size_t i = 0; i < 20000; i++) count[size_t(d[i])] += 1.0 / 20000;
    CHECK_ALL_NEAR(count, (Vec{0.1, 0.2, 0.3, 0.4, 0}), 0.015);   // 4 standard deviations
    for (size_t i = 20000; i < 40000; i++) CHECK_EQ(d[i], 4);
    CHECK(weights.multinomial(20000, true, 5).to_vector<int64_t>() == d);
    CHECK(weights.multinomial(20000, true, 6).to_vector<int64_t>() != d);
    CHECK(Tensor::from_vector({1.f, 3.f}).multinomial(3, true).shape() == S({3}));

    // without replacement: each row a permutation; the first draw at the weights' rates, the
    // second at Σ_i p_i p_j / (1 - p_i) (i ≠ j)
    const Vec p{0.1, 0.2, 0.3, 0.4};
    Tensor rows = Tensor::from_vector(std::vector<double>(p)).expand({20000, 4});
    std::vector<int64_t> order = rows.multinomial(4, false, 9).to_vector<int64_t>();
    Vec first(4, 0), second(4, 0), second_expected(4, 0);
    bool permutations = true;
    for (size_t r = 0; r < 20000; r++) {
        std::vector<int64_t> row(order.begin() + long(4 * r), order.begin() + long(4 * r + 4));
        first[size_t(row[0])] += 1.0 / 20000, second[size_t(row[1])] += 1.0 / 20000;
        std::sort(row.begin(), row.end());
        permutations = permutations && row == std::vector<int64_t>{0, 1, 2, 3};
    }
    CHECK(permutations);
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++)
            if (i != j) second_expected[j] += p[i] * p[j] / (1 - p[i]);
    CHECK_ALL_NEAR(first, p, 0.015);
    CHECK_ALL_NEAR(second, second_expected, 0.015);
    Tensor last_zero = Tensor::from_vector({1.f, 0.f, 2.f}).expand({50, 3}).multinomial(3);
    for (int64_t x : last_zero.slice(1, 2, 3).to_vector<int64_t>()) CHECK_EQ(x, 1);
    CHECK(Tensor::from_vector({1.f, 3.f}).multinomial(1).shape() == S({1}));

    Tensor probability = Tensor::full({10000}, 0.3, DType::FLOAT64);
    std::vector<double> coin = probability.bernoulli(2).to_vector<double>();
    double heads = 0;
    for (double c : coin) {
        CHECK(c == 0 || c == 1);
        heads += c / 10000;
    }
    CHECK_NEAR(heads, 0.3, 0.02);
    CHECK(probability.bernoulli(2).to_vector<double>() == coin);
    CHECK(probability.bernoulli(2).dtype() == DType::FLOAT64);
    CHECK_ALL_NEAR(vals(Tensor::from_vector({0.f, 1.f, 0.f, 1.f}).bernoulli()), (Vec{0, 1, 0, 1}),
                   0);

    CHECK_THROWS(vals(Tensor::from_vector({0.5f, -0.1f}).multinomial(1)), "multinomial",
                 "weights finite, at least 0");
    CHECK_THROWS(vals(Tensor::from_vector({0.5f, NAN}).multinomial(1, true)), "multinomial");
    CHECK_THROWS(vals(Tensor::from_vector({0.f, 0.f}, {1, 2}).multinomial(1)), "multinomial",
                 "summing above 0");
    CHECK_THROWS(Tensor::from_vector({0.5f, 0.5f}).multinomial(3), "multinomial", "3 samples",
                 "without replacement", "2 categories");
    CHECK_THROWS(Tensor::from_vector({1, 2}).multinomial(1), "multinomial", "int32");
    CHECK_THROWS(Tensor::ones({2, 2, 2}).multinomial(1), "multinomial", "[2,2,2]");
    CHECK_THROWS(vals(Tensor::from_vector({0.5f, 1.5f}).bernoulli()), "bernoulli",
                 "each in [0, 1]");
}

// zeros_like, ones_like, full_like, rand_like, randn_like: the shape and dtype of their model
TEST(ops_like_constructors) {
    Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor i = Tensor::from_vector({1, 2, 3});
    Tensor z = Tensor::zeros_like(x), o = Tensor::ones_like(i), f = Tensor::full_like(x, 2.5);
    Tensor r = Tensor::rand_like(x, 7), n = Tensor::randn_like(x, 7);
    CHECK(z.shape() == S({2, 3}) && z.dtype() == DType::FLOAT64);
    CHECK(o.shape() == S({3}) && o.dtype() == DType::INT32);
    CHECK(f.dtype() == DType::FLOAT64 && r.dtype() == DType::FLOAT64 && n.dtype() == DType::FLOAT64);
    CHECK(r.shape() == S({2, 3}) && n.shape() == S({2, 3}));
    CHECK_ALL_NEAR(vals(z), (Vec(6, 0.0)), 0);
    CHECK(o.to_vector<int64_t>() == (std::vector<int64_t>{1, 1, 1}));
    CHECK_ALL_NEAR(vals(f), (Vec(6, 2.5)), 0);
    // the same values as rand and randn of that seed, in x's dtype
    CHECK_ALL_NEAR(vals(r), vals(Tensor::rand({2, 3}, 7)), 0);
    CHECK_ALL_NEAR(vals(n), vals(Tensor::randn({2, 3}, 7)), 0);
    for (double u : vals(r)) CHECK(u >= 0 && u < 1);
    CHECK_THROWS(Tensor::rand_like(i), "rand_like", "int32", "[3]", "not a float");
    CHECK_THROWS(Tensor::randn_like(i), "randn_like", "int32");
}

TEST(ops_matmul_larger_and_dtypes) {
    std::vector<float> av = randf(33 * 47, 111), bv = randf(47 * 29, 112);
    Tensor a = Tensor::from_vector(av, {33, 47}), b = Tensor::from_vector(bv, {47, 29});
    std::vector<double> ad = randd(6 * 7, 113), bd = randd(7 * 5, 114);
    Tensor A = Tensor::from_vector(ad, {6, 7}), B = Tensor::from_vector(bd, {7, 5});
    std::vector<int32_t> ai = randi(12, 115, -9, 9), bi = randi(12, 116, -9, 9);
    Tensor Ai = Tensor::from_vector(ai, {3, 4}), Bi = Tensor::from_vector(bi, {4, 3});
    Tensor mf = a.matmul(b), md = A.matmul(B), mi = Ai.matmul(Bi), mix = Ai.matmul(Tensor::from_vector(bd, {7, 5}).shrink({{0, 4}, {0, 5}}));
    CHECK(mf.dtype() == DType::FLOAT32);
    CHECK(md.dtype() == DType::FLOAT64);
    CHECK(mi.dtype() == DType::INT32);
    CHECK(mix.dtype() == DType::FLOAT64);
    // matmul + bias + relu, fused
    Tensor bias = Tensor::from_vector(randf(29, 117));
    Tensor fused = (a.matmul(b) + bias).relu();
    tg::realize({mf, md, mi, mix, fused});
    Vec wf = ref_matmul(D(av), {33, 47}, D(bv), {47, 29}, nullptr);
    CHECK_ALL_NEAR(vals(mf), wf, F32);
    CHECK_ALL_NEAR(vals(md), ref_matmul(ad, {6, 7}, bd, {7, 5}, nullptr), F64);
    CHECK_ALL_NEAR(vals(mi), ref_matmul(D(ai), {3, 4}, D(bi), {4, 3}, nullptr), 0);
    Vec bd4(bd.begin(), bd.begin() + 20);
    CHECK_ALL_NEAR(vals(mix), ref_matmul(D(ai), {3, 4}, bd4, {4, 5}, nullptr), F64);
    Vec bb = vals(bias), wfused = ref_binary(wf, {33, 29}, bb, {29}, [](double x, double y) { return std::max(x + y, 0.0); });
    CHECK_ALL_NEAR(vals(fused), wfused, F32);
}

TEST(ops_einsum) {
    std::vector<float> m34 = randf(12, 121), m45 = randf(20, 122), b234 = randf(24, 123),
                       b245 = randf(40, 124), sq = randf(16, 125), v5 = randf(5, 126), w5 = randf(5, 127);
    Tensor M34 = Tensor::from_vector(m34, {3, 4}), M45 = Tensor::from_vector(m45, {4, 5}),
           B234 = Tensor::from_vector(b234, {2, 3, 4}), B245 = Tensor::from_vector(b245, {2, 4, 5}),
           SQ = Tensor::from_vector(sq, {4, 4}), V = Tensor::from_vector(v5), W = Tensor::from_vector(w5);
    Tensor e1 = tg::einsum("ij,jk->ik", {M34, M45}), e2 = tg::einsum("ij,jk", {M34, M45}),
           e3 = tg::einsum("bij,bjk->bik", {B234, B245}), e4 = tg::einsum("...ij,...jk->...ik", {B234, B245}),
           e5 = tg::einsum("ii->i", {SQ}), e6 = tg::einsum("ii", {SQ}), e7 = tg::einsum("i,i->", {V, W}),
           e8 = tg::einsum("ij->ji", {M34}), e9 = tg::einsum("...ij,jk->...ik", {B234, M45}),
           e10 = tg::einsum("ij,ij->ij", {M34, M34}), e11 = tg::einsum("ij->", {M34}),
           e12 = tg::einsum("i,j->ij", {V, W}), e13 = tg::einsum("ba,bc->ac", {M34, M34}),
           e14 = tg::einsum("bij -> bji", {B234});
    CHECK(e1.shape() == S({3, 5}));
    CHECK(e2.shape() == S({3, 5}));
    CHECK(e3.shape() == S({2, 3, 5}));
    CHECK(e4.shape() == S({2, 3, 5}));
    CHECK(e5.shape() == S({4}));
    CHECK(e6.shape() == S({}));
    CHECK(e7.shape() == S({}));
    CHECK(e8.shape() == S({4, 3}));
    CHECK(e9.shape() == S({2, 3, 5}));
    CHECK(e11.shape() == S({}));
    CHECK(e12.shape() == S({5, 5}));
    CHECK(e13.shape() == S({4, 4}));
    CHECK(e14.shape() == S({2, 4, 3}));
    tg::realize({e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14});
    Vec mm = ref_matmul(D(m34), {3, 4}, D(m45), {4, 5}, nullptr);
    Vec bmm = ref_matmul(D(b234), {2, 3, 4}, D(b245), {2, 4, 5}, nullptr);
    CHECK_ALL_NEAR(vals(e1), mm, F32);
    CHECK_ALL_NEAR(vals(e2), mm, F32);
    CHECK_ALL_NEAR(vals(e3), bmm, F32);
    CHECK_ALL_NEAR(vals(e4), bmm, F32);
    Vec diag;
    double trace = 0, dot = 0, total = 0;
    for (int i = 0; i < 4; i++) { diag.push_back(sq[size_t(i * 5)]); trace += sq[size_t(i * 5)]; }
    for (int i = 0; i < 5; i++) dot += double(v5[size_t(i)]) * w5[size_t(i)];
    for (float x : m34) total += x;
    CHECK_ALL_NEAR(vals(e5), diag, 0);
    CHECK_ALL_NEAR(vals(e6), (Vec{trace}), F32);   // implicit "ii" is the trace, like NumPy and PyTorch
    CHECK_NEAR(e7.item(), dot, F32);
    CHECK_ALL_NEAR(vals(e8), ref_permute(D(m34), {3, 4}, {1, 0}, nullptr), 0);
    CHECK_ALL_NEAR(vals(e9), ref_matmul(D(b234), {2, 3, 4}, D(m45), {4, 5}, nullptr), F32);
    CHECK_ALL_NEAR(vals(e10), ref_unary(D(m34), [](double x) { return x * x; }), F32);
    CHECK_NEAR(e11.item(), total, F32);
    Vec outer, ata = ref_matmul(ref_permute(D(m34), {3, 4}, {1, 0}, nullptr), {4, 3}, D(m34), {3, 4}, nullptr);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) outer.push_back(double(v5[size_t(i)]) * w5[size_t(j)]);
    CHECK_ALL_NEAR(vals(e12), outer, F32);
    CHECK_ALL_NEAR(vals(e13), ata, F32);
    CHECK_ALL_NEAR(vals(e14), ref_permute(D(b234), {2, 3, 4}, {0, 2, 1}, nullptr), 0);
}

// =============================================================================== indexing, softmax

TEST(ops_gather) {
    std::vector<float> sv = randf(12, 131);
    Tensor src = Tensor::from_vector(sv, {3, 4});
    std::vector<int32_t> i0 = {2, 0, 1, 2, 0, 0, 2, 1};           // [2,4], axis 0
    std::vector<int32_t> i1 = {3, 0, 1, 1, 2, 2, 0, 3, 3};        // [3,3], axis 1
    std::vector<int32_t> i2 = {1, 0, 2, 3, 2, 1};                 // [2,3], axis 1 (fewer rows/cols)
    Tensor I0 = Tensor::from_vector(i0, {2, 4}), I1 = Tensor::from_vector(i1, {3, 3}), I2 = Tensor::from_vector(i2, {2, 3});
    Tensor g0 = src.gather(0, I0), g1 = src.gather(1, I1), g2 = src.gather(-1, I2);
    CHECK(g0.shape() == S({2, 4}));
    CHECK(g1.shape() == S({3, 3}));
    CHECK(g2.shape() == S({2, 3}));
    CHECK(g0.dtype() == DType::FLOAT32);
    tg::realize({g0, g1, g2});
    Vec w0, w1, w2;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) w0.push_back(sv[size_t(i0[size_t(i * 4 + j)] * 4 + j)]);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) w1.push_back(sv[size_t(i * 4 + i1[size_t(i * 3 + j)])]);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) w2.push_back(sv[size_t(i * 4 + i2[size_t(i * 3 + j)])]);
    CHECK_ALL_NEAR(vals(g0), w0, 0);
    CHECK_ALL_NEAR(vals(g1), w1, 0);
    CHECK_ALL_NEAR(vals(g2), w2, 0);
    // int32 source, 3-D, middle axis
    std::vector<int32_t> s3 = randi(24, 132, -100, 100), ix = randi(2 * 5 * 4, 133, 0, 2);
    Tensor g3 = Tensor::from_vector(s3, {2, 3, 4}).gather(1, Tensor::from_vector(ix, {2, 5, 4}));
    CHECK(g3.dtype() == DType::INT32);
    CHECK(g3.shape() == S({2, 5, 4}));
    Vec w3;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 4; c++) w3.push_back(s3[size_t((a * 3 + ix[size_t((a * 5 + b) * 4 + c)]) * 4 + c)]);
    CHECK_ALL_NEAR(vals(g3), w3, 0);
}

TEST(ops_scatter_add_index_add) {
    // scatter_add along each axis of a [3, 4, 2] self, with a src longer than the index along
    // every axis (only the part the index covers is added) and repeated indices
    std::vector<float> base = randf(24, 151), sv = randf(4 * 5 * 3, 152);
    for (int axis = 0; axis < 3; axis++) {
        Shape idx_shape = {2, 3, 2};
        const int64_t along[] = {3, 4, 2};
        std::vector<int32_t> iv = randi(12, 153 + axis, 0, int32_t(along[axis]) - 1);
        Tensor out = Tensor::from_vector(base, {3, 4, 2})
                         .scatter_add(axis, Tensor::from_vector(iv, idx_shape),
                                      Tensor::from_vector(sv, {4, 5, 3}));
        Vec want(base.begin(), base.end());
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 2; c++) {
                    int at[] = {a, b, c};
                    at[axis] = iv[size_t((a * 3 + b) * 2 + c)];
                    want[size_t((at[0] * 4 + at[1]) * 2 + at[2])] +=
                        sv[size_t((a * 5 + b) * 3 + c)];
                }
        CHECK(out.shape() == S({3, 4, 2}));
        CHECK_ALL_NEAR(vals(out), want, F32);
    }
    // integers, and index_add with alpha along the last axis
    Tensor counts = Tensor::zeros({4}, DType::INT32).scatter_add(
        0, Tensor::from_vector(std::vector<int32_t>{3, 1, 3, 3}),
        Tensor::ones({4}, DType::INT32));
    CHECK(counts.dtype() == DType::INT32);
    CHECK_ALL_NEAR(vals(counts), (Vec{0, 1, 0, 3}), 0);
    std::vector<float> xv = randf(2 * 3, 154), srcv = randf(2 * 4, 155);
    std::vector<int32_t> rows = {2, 0, 2, 1};
    Tensor added = Tensor::from_vector(xv, {2, 3}).index_add(
        -1, Tensor::from_vector(rows), Tensor::from_vector(srcv, {2, 4}), -2.0);
    Vec want(xv.begin(), xv.end());
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) want[size_t(i * 3 + rows[size_t(j)])] -= 2 * srcv[size_t(i * 4 + j)];
    CHECK_ALL_NEAR(vals(added), want, F32);
}

TEST(ops_index_select_embedding) {
    std::vector<float> sv = randf(20, 141);
    Tensor src = Tensor::from_vector(sv, {4, 5});
    Tensor idx = Tensor::from_vector(std::vector<int32_t>{3, 0, 3});
    Tensor r0 = src.index_select(0, idx), r1 = src.index_select(1, idx), rn = src.index_select(-1, idx);
    // embedding: C [V=5, E=3], X [B=2, T=3]
    std::vector<float> cv = randf(15, 142);
    std::vector<int32_t> xv = {4, 0, 2, 2, 1, 4};
    Tensor C = Tensor::from_vector(cv, {5, 3}), X = Tensor::from_vector(xv, {2, 3});
    Tensor emb = C[X], emb1 = C[Tensor::from_vector(std::vector<int32_t>{1, 3})];
    CHECK_ALL_NEAR(vals(C[Tensor::from_vector({-1, 0, -5})]),
                   vals(C[Tensor::from_vector({4, 0, 0})]), 0);   // from the end, as PyTorch
    // named by the call the user made, its gradient's too
    CHECK_THROWS(tg::nn::functional::embedding(Tensor::from_vector({-1}), C).realize(),
                 "embedding: index out of range [0, 5)", "got -1");
    Tensor rows = C.detach().requires_grad();
    std::string here = "test_ops.cpp:" + std::to_string(__LINE__ + 1);
    Tensor picked = tg::nn::functional::embedding(Tensor::from_vector({7}), rows).sum();
    CHECK_THROWS(tg::gradients(picked, {rows})[0].realize(),   // the gather itself never runs
                 "embedding (computing its gradient): index out of range [0, 5)", "got 7",
                 here.c_str());
    CHECK_THROWS(C[Tensor::from_vector({-6})].realize(), "index: index out of range", "got -1");
    CHECK(r0.shape() == S({3, 5}));
    CHECK(r1.shape() == S({4, 3}));
    CHECK(emb.shape() == S({2, 3, 3}));
    CHECK(emb1.shape() == S({2, 3}));
    tg::realize({r0, r1, rn, emb, emb1});
    Vec w0, w1, we, we1;
    for (int k : {3, 0, 3})
        for (int j = 0; j < 5; j++) w0.push_back(sv[size_t(k * 5 + j)]);
    for (int i = 0; i < 4; i++)
        for (int k : {3, 0, 3}) w1.push_back(sv[size_t(i * 5 + k)]);
    for (int32_t t : xv)
        for (int e = 0; e < 3; e++) we.push_back(cv[size_t(t * 3 + e)]);
    for (int t : {1, 3})
        for (int e = 0; e < 3; e++) we1.push_back(cv[size_t(t * 3 + e)]);
    CHECK_ALL_NEAR(vals(r0), w0, 0);
    CHECK_ALL_NEAR(vals(r1), w1, 0);
    CHECK_ALL_NEAR(vals(rn), w1, 0);
    CHECK_ALL_NEAR(vals(emb), we, 0);
    CHECK_ALL_NEAR(vals(emb1), we1, 0);
}

TEST(ops_softmax_log_softmax) {
    std::vector<float> xv = randf(24, 151, -4, 4);
    xv[0] = 100;   // large values must not overflow
    xv[1] = 101;
    Tensor x = Tensor::from_vector(xv, {4, 6});
    Tensor s1 = x.softmax(), s0 = x.softmax(0), l1 = x.log_softmax(-1), l0 = x.log_softmax(0);
    Tensor rows = s1.sum(1);
    std::vector<double> dv = randd(12, 152, -3, 3);
    Tensor xd = Tensor::from_vector(dv, {3, 4});
    Tensor sd = xd.softmax(1), ld = xd.log_softmax(1);
    Tensor si = Tensor::from_vector(std::vector<int32_t>{1, 2, 3}).softmax();
    CHECK(si.dtype() == DType::FLOAT32);
    CHECK(sd.dtype() == DType::FLOAT64);
    CHECK(s1.shape() == S({4, 6}));
    tg::realize({s1, s0, l1, l0, rows, sd, ld, si});
    auto ref = [](const Vec& v, const Shape& s, int axis, bool log) {
        Vec out(v.size());
        int64_t n = s[size_t(axis)], outer = axis == 0 ? 1 : s[0], inner = axis == 0 ? s[1] : 1;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t in = 0; in < inner; in++) {
                double m = -INFINITY, z = 0;
                for (int64_t k = 0; k < n; k++) m = std::max(m, v[size_t((o * n + k) * inner + in)]);
                for (int64_t k = 0; k < n; k++) z += std::exp(v[size_t((o * n + k) * inner + in)] - m);
                for (int64_t k = 0; k < n; k++) {
                    double x = v[size_t((o * n + k) * inner + in)] - m;
                    out[size_t((o * n + k) * inner + in)] = log ? x - std::log(z) : std::exp(x) / z;
                }
            }
        return out;
    };
    Vec X = D(xv);
    CHECK_ALL_NEAR(vals(s1), ref(X, {4, 6}, 1, false), F32);
    CHECK_ALL_NEAR(vals(s0), ref(X, {4, 6}, 0, false), F32);
    CHECK_ALL_NEAR(vals(l1), ref(X, {4, 6}, 1, true), F32);
    CHECK_ALL_NEAR(vals(l0), ref(X, {4, 6}, 0, true), F32);
    CHECK_ALL_NEAR(vals(rows), Vec(4, 1.0), F32);
    CHECK_ALL_NEAR(vals(sd), ref(dv, {3, 4}, 1, false), F64);
    CHECK_ALL_NEAR(vals(ld), ref(dv, {3, 4}, 1, true), F64);
    CHECK_ALL_NEAR(vals(si), ref({1, 2, 3}, {1, 3}, 1, false), F32);
}

// =============================================================================== dtypes

TEST(ops_dtype_promotion) {
    Tensor i = Tensor::from_vector(std::vector<int32_t>{7, -7, 3, 0});
    Tensor j = Tensor::from_vector(std::vector<int32_t>{2, 2, -4, 5});
    Tensor f = Tensor::from_vector(std::vector<float>{0.5f, 1.5f, -2, 0.25f});
    Tensor d = Tensor::from_vector(std::vector<double>{0.1, 0.2, 0.3, 1.0 / 3});
    Tensor if_ = i + f, fd = f + d, i1 = i + 1, i15 = i + 1.5, idiv = i / j, ii = i * j, isub = i - j,
           id = i * d, r1 = 1 - i, idiv2 = i / 2, fi = f * i;
    CHECK(if_.dtype() == DType::FLOAT32);
    CHECK(fi.dtype() == DType::FLOAT32);
    CHECK(fd.dtype() == DType::FLOAT64);
    CHECK(i1.dtype() == DType::INT32);
    CHECK(r1.dtype() == DType::INT32);
    CHECK(i15.dtype() == DType::FLOAT32);
    CHECK(idiv.dtype() == DType::FLOAT32);
    CHECK(idiv2.dtype() == DType::FLOAT32);
    CHECK(ii.dtype() == DType::INT32);
    CHECK(isub.dtype() == DType::INT32);
    CHECK(id.dtype() == DType::FLOAT64);
    tg::realize({if_, fd, i1, i15, idiv, ii, isub, id, r1, idiv2, fi});
    CHECK_ALL_NEAR(vals(if_), (Vec{7.5, -5.5, 1, 0.25}), 0);
    CHECK_ALL_NEAR(vals(fi), (Vec{3.5, -10.5, -6, 0}), 0);
    // float32 values widen exactly, then add in float64
    CHECK_ALL_NEAR(vals(fd), (Vec{0.5 + 0.1, 1.5 + 0.2, -2 + 0.3, 0.25 + 1.0 / 3}), F64);
    CHECK_ALL_NEAR(vals(i1), (Vec{8, -6, 4, 1}), 0);
    CHECK_ALL_NEAR(vals(r1), (Vec{-6, 8, -2, 1}), 0);
    CHECK_ALL_NEAR(vals(i15), (Vec{8.5, -5.5, 4.5, 1.5}), 0);
    CHECK_ALL_NEAR(vals(idiv), (Vec{3.5, -3.5, -0.75, 0}), F32);   // true division
    CHECK_ALL_NEAR(vals(idiv2), (Vec{3.5, -3.5, 1.5, 0}), F32);
    CHECK_ALL_NEAR(vals(ii), (Vec{14, -14, -12, 0}), 0);
    CHECK_ALL_NEAR(vals(isub), (Vec{5, -9, 7, -5}), 0);
    CHECK_ALL_NEAR(vals(id), (Vec{0.7, -1.4, 0.9, 0}), F64);
}

TEST(ops_dtype_bool) {
    Tensor a = Tensor::from_vector(std::vector<int32_t>{0, 0, 1, 1}) != 0;
    Tensor b = Tensor::from_vector(std::vector<int32_t>{0, 1, 0, 1}) != 0;
    CHECK(a.dtype() == DType::BOOL);
    Tensor add = a + b, mul = a * b, s = a.sum(), sb = (a == b).sum(), mx = a.maximum(b), mn = a.minimum(b),
           bf = a.cast(DType::FLOAT32) + 0.5, bi = a + Tensor::from_vector(std::vector<int32_t>{5, 5, 5, 5}),
           bmax = a.max(), bmin = a.min();
    CHECK(add.dtype() == DType::BOOL);     // like PyTorch: bool + bool is bool (logical or)
    CHECK(mul.dtype() == DType::BOOL);
    CHECK(s.dtype() == DType::INT64);       // sum of bool counts, in int64 as in PyTorch
    CHECK(sb.dtype() == DType::INT64);
    CHECK(mx.dtype() == DType::BOOL);
    CHECK(bf.dtype() == DType::FLOAT32);
    CHECK(bi.dtype() == DType::INT32);
    CHECK(bmax.dtype() == DType::BOOL);
    tg::realize({add, mul, s, sb, mx, mn, bf, bi, bmax, bmin});
    CHECK_ALL_NEAR(ivals(add), (std::vector<int>{0, 1, 1, 1}), 0);
    CHECK_ALL_NEAR(ivals(mul), (std::vector<int>{0, 0, 0, 1}), 0);
    CHECK_EQ(s.item(), 2.0);
    CHECK_EQ(sb.item(), 2.0);
    CHECK_ALL_NEAR(ivals(mx), (std::vector<int>{0, 1, 1, 1}), 0);
    CHECK_ALL_NEAR(ivals(mn), (std::vector<int>{0, 0, 0, 1}), 0);
    CHECK_ALL_NEAR(vals(bf), (Vec{0.5, 0.5, 1.5, 1.5}), 0);
    CHECK_ALL_NEAR(vals(bi), (Vec{5, 5, 6, 6}), 0);
    CHECK_EQ(bmax.item(), 1.0);
    CHECK_EQ(bmin.item(), 0.0);
    // a bool tensor of a comparison, summed along an axis
    Tensor m = Tensor::from_vector(std::vector<float>{1, -1, 2, -2, 3, -3}, {2, 3}) > 0;
    Tensor per_row = m.sum(1);
    CHECK(per_row.dtype() == DType::INT64);
    CHECK_ALL_NEAR(vals(per_row), (Vec{2, 1}), 0);
}

// Values at the ends of ranges and at NaN, where a composition could part from PyTorch: the
// lowest integer (min as a max of -x would wrap), NaN cast to bool (true, also when folded at
// build time), the gradients of std at a constant input and of clamp at NaN (0), softmax over
// an empty axis, an integer next to a bool tensor (int64), one_hot of ids out of range.
TEST(ops_edge_values_as_pytorch) {
    const int32_t lo32 = INT32_MIN;
    const int64_t lo64 = INT64_MIN;
    Tensor i32 = Tensor::from_vector(std::vector<int32_t>{5, lo32, 3});
    Tensor i64 = Tensor::from_vector(std::vector<int64_t>{5, lo64, 3});
    Tensor i32_rev = Tensor::from_vector(std::vector<int32_t>{lo32, 5, 3});
    auto [values, indices] = i64.reshape({1, 3}).min(1);
    auto [smallest, where_smallest] = i64.topk(2, -1, false);
    tg::realize({values, indices, smallest, where_smallest});
    CHECK(i32.min().to_vector<int32_t>() == std::vector<int32_t>{lo32});
    CHECK(i64.min().to_vector<int64_t>() == std::vector<int64_t>{lo64});
    CHECK(values.to_vector<int64_t>() == std::vector<int64_t>{lo64});
    CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1});
    CHECK(i32.minimum(i32_rev).to_vector<int32_t>() == (std::vector<int32_t>{lo32, lo32, 3}));
    CHECK(i32.argmin().to_vector<int64_t>() == std::vector<int64_t>{1});
    CHECK(i64.argmin().to_vector<int64_t>() == std::vector<int64_t>{1});
    CHECK(smallest.to_vector<int64_t>() == (std::vector<int64_t>{lo64, 3}));
    CHECK(where_smallest.to_vector<int64_t>() == (std::vector<int64_t>{1, 2}));
    CHECK(i32.max().to_vector<int32_t>() == std::vector<int32_t>{5});

    Tensor nan_and_zero = Tensor::from_vector(std::vector<float>{NAN, 0.0f});
    CHECK_ALL_NEAR(ivals(nan_and_zero.cast(DType::BOOL)), (std::vector<int>{1, 0}), 0);
    CHECK_ALL_NEAR(ivals(Tensor::full({2}, NAN).cast(DType::BOOL)), (std::vector<int>{1, 1}), 0);

    Tensor flat = Tensor::from_vector(std::vector<float>{2, 2, 2});
    flat.requires_grad();
    Tensor deviation = flat.std();
    deviation.backward();
    CHECK_EQ(deviation.item(), 0.0);
    CHECK_ALL_NEAR(vals(flat.grad()), (Vec{0, 0, 0}), 0);
    Tensor varied = Tensor::from_vector(std::vector<float>{1, 2, 4});
    varied.requires_grad();
    varied.std().backward();   // (x - mean) / ((n - 1)·std) elsewhere
    const double sd = std::sqrt(7.0 / 3);
    CHECK_ALL_NEAR(vals(varied.grad()), (Vec{(-4.0 / 3) / (2 * sd), (-1.0 / 3) / (2 * sd),
                                             (5.0 / 3) / (2 * sd)}), F32);

    Tensor clamped = Tensor::from_vector(std::vector<float>{NAN, -3, 0.5f, 3});
    clamped.requires_grad();
    Tensor c = clamped.clamp(-1.0, 1.0);
    c.sum().backward();
    Vec cv = vals(c);
    CHECK(std::isnan(cv[0]));
    CHECK_ALL_NEAR((Vec{cv[1], cv[2], cv[3]}), (Vec{-1, 0.5, 1}), 0);
    CHECK_ALL_NEAR(vals(clamped.grad()), (Vec{0, 0, 1, 0}), 0);
    Vec crossed = vals(clamped.detach().clamp(1.0, -1.0));   // min > max: max, NaN stays
    CHECK(std::isnan(crossed[0]));
    CHECK_ALL_NEAR((Vec{crossed[1], crossed[2], crossed[3]}), (Vec{-1, -1, -1}), 0);

    for (const Tensor& empty : {Tensor::zeros({3, 0}).softmax(-1),
                                Tensor::zeros({3, 0}).log_softmax(1)}) {
        CHECK(empty.shape() == (Shape{3, 0}));
        CHECK(vals(empty).empty());
    }

    Tensor mask = Tensor::from_vector(std::vector<float>{1, -1}) > 0;
    Tensor counted = mask + 1, scaled = mask * 1, still_bool = mask + true;
    CHECK(counted.dtype() == DType::INT64);
    CHECK(scaled.dtype() == DType::INT64);
    CHECK(still_bool.dtype() == DType::BOOL);
    CHECK_ALL_NEAR(ivals(counted), (std::vector<int>{2, 1}), 0);
    CHECK_ALL_NEAR(ivals(scaled), (std::vector<int>{1, 0}), 0);
    CHECK_ALL_NEAR(ivals(still_bool), (std::vector<int>{1, 1}), 0);

    namespace F = tg::nn::functional;
    Tensor ids = Tensor::from_vector(std::vector<int64_t>{2, 0});
    CHECK_ALL_NEAR(ivals(F::one_hot(ids, 3)), (std::vector<int>{0, 0, 1, 1, 0, 0}), 0);
    for (int64_t bad : {3, -1}) {
        Tensor out_of_range = Tensor::from_vector(std::vector<int64_t>{0, bad});
        CHECK_THROWS(F::one_hot(out_of_range, 3).realize(), "one_hot: index out of range [0, 3)",
                     "test_ops.cpp:");
    }
}

TEST(ops_cast) {
    Tensor f = Tensor::from_vector(std::vector<float>{-1.7f, -0.5f, 0.5f, 1.7f, 2.999f, -0.0f, 100.25f});
    Tensor fi = f.cast(DType::INT32), fb = f.cast(DType::BOOL), fd = f.cast(DType::FLOAT64);
    Tensor d = Tensor::from_vector(std::vector<double>{1.0 / 3, 1e-50, 16777217});
    Tensor df = d.cast(DType::FLOAT32), di = d.cast(DType::INT32);
    Tensor i = Tensor::from_vector(std::vector<int32_t>{-3, 0, 16777217});
    Tensor if_ = i.cast(DType::FLOAT32), ib = i.cast(DType::BOOL), id = i.cast(DType::FLOAT64);
    Tensor b = Tensor::from_vector(std::vector<int32_t>{0, 2}) != 0;
    Tensor bi = b.cast(DType::INT32), bfl = b.cast(DType::FLOAT32), same = f.cast(DType::FLOAT32);
    CHECK(fi.dtype() == DType::INT32);
    CHECK(fb.dtype() == DType::BOOL);
    CHECK(fd.dtype() == DType::FLOAT64);
    CHECK(df.dtype() == DType::FLOAT32);
    CHECK(bi.dtype() == DType::INT32);
    CHECK(same.dtype() == DType::FLOAT32);
    tg::realize({fi, fb, fd, df, di, if_, ib, id, bi, bfl});
    CHECK_ALL_NEAR(vals(fi), (Vec{-1, 0, 0, 1, 2, 0, 100}), 0);   // truncation toward zero
    CHECK_ALL_NEAR(ivals(fb), (std::vector<int>{1, 1, 1, 1, 1, 0, 1}), 0);
    CHECK_ALL_NEAR(vals(fd), (Vec{double(-1.7f), -0.5, 0.5, double(1.7f), double(2.999f), 0, 100.25}), 0);
    CHECK_ALL_NEAR(vals(df), (Vec{double(float(1.0 / 3)), double(float(1e-50)), 16777216}), 0);
    CHECK_ALL_NEAR(vals(di), (Vec{0, 0, 16777217}), 0);
    CHECK_ALL_NEAR(vals(if_), (Vec{-3, 0, 16777216}), 0);   // rounded to float32
    CHECK_ALL_NEAR(ivals(ib), (std::vector<int>{1, 0, 1}), 0);
    CHECK_ALL_NEAR(vals(id), (Vec{-3, 0, 16777217}), 0);
    CHECK_ALL_NEAR(vals(bi), (Vec{0, 1}), 0);
    CHECK_ALL_NEAR(vals(bfl), (Vec{0, 1}), 0);
}

// =============================================================================== inspection, running

TEST(ops_shape_queries_item_realize) {
    Tensor x = Tensor::zeros({2, 3, 4});
    CHECK(x.shape() == S({2, 3, 4}));
    CHECK_EQ(x.ndim(), 3);
    CHECK_EQ(x.numel(), 24);
    CHECK_EQ(x.size(0), 2);
    CHECK_EQ(x.size(-1), 4);
    CHECK(x.dtype() == DType::FLOAT32);
    CHECK(x.defined());
    CHECK(!Tensor().defined());
    Tensor s = Tensor::full({}, 2.5);
    CHECK_EQ(s.ndim(), 0);
    CHECK_EQ(s.numel(), 1);
    CHECK_EQ(s.item(), 2.5);
    CHECK_EQ(Tensor::full({1, 1}, -3).item(), -3.0);
    CHECK_EQ(Tensor::full({1}, 7, DType::INT32).item(), 7.0);
    // realize() keeps the result; reading twice gives the same values
    std::vector<float> v = randf(6, 161);
    Tensor y = Tensor::from_vector(v, {2, 3}) * 2;
    Tensor& same = y.realize();
    CHECK(&same == &y);
    Vec first = vals(y), second = vals(y);
    CHECK(first == second);
    CHECK_ALL_NEAR(first, ref_unary(D(v), [](double t) { return 2 * t; }), F32);
    CHECK(y.shape() == S({2, 3}));
    // a realized tensor feeds later computations
    Tensor z = y + 1;
    CHECK_ALL_NEAR(vals(z), ref_unary(D(v), [](double t) { return 2 * t + 1; }), F32);
    // to_vector in other element types
    Tensor k = Tensor::from_vector(std::vector<int32_t>{1, -2, 3});
    CHECK(k.to_vector<int32_t>() == (std::vector<int32_t>{1, -2, 3}));
    CHECK(k.to_vector<double>() == (Vec{1, -2, 3}));
    CHECK(k.to_vector() == (std::vector<float>{1, -2, 3}));
    // several results in one program, sharing an input
    Tensor a = Tensor::from_vector(v), p = a.exp(), q = a.sum(), r = a * a;
    tg::realize({p, q, r});
    CHECK_ALL_NEAR(vals(p), ref_unary(D(v), [](double t) { return std::exp(t); }), F32);
    CHECK_NEAR(q.item(), ref_reduce(D(v), {6}, {0}, Red::SUM)[0], F32);
    CHECK_ALL_NEAR(vals(r), ref_unary(D(v), [](double t) { return t * t; }), F32);
}

TEST(ops_print_basic) {
    Tensor a = Tensor::from_vector(std::vector<float>{1.5f, 2, 3});
    CHECK_EQ(a.to_string(), std::string("tensor([1.5000, 2.0000, 3.0000])"));
    std::ostringstream os;
    os << a;
    CHECK_EQ(os.str(), a.to_string());
    CHECK_EQ(Tensor::from_vector(std::vector<float>{1, 2}).to_string(), std::string("tensor([1., 2.])"));
    CHECK_EQ(Tensor::from_vector(std::vector<int32_t>{1, 2}).to_string(), std::string("tensor([1, 2], dtype=int32)"));
    CHECK_EQ(Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}).to_string(),
             std::string("tensor([[1., 2.],\n        [3., 4.]])"));
    Tensor b = Tensor::from_vector(std::vector<int32_t>{1, 0}) != 0;
    CHECK_EQ(b.to_string(), std::string("tensor([ True, False])"));
    CHECK_EQ(Tensor::full({}, 3.5).to_string(), std::string("tensor(3.5000)"));
    CHECK_EQ(Tensor::full({}, 4, DType::INT32).to_string(), std::string("tensor(4, dtype=int32)"));
    CHECK_EQ(Tensor::from_vector(std::vector<float>{-1.5f, 2}).to_string(), std::string("tensor([-1.5000,  2.0000])"));
    CHECK_EQ(Tensor::from_vector(std::vector<double>{1.25, 2}).to_string(),
             std::string("tensor([1.2500, 2.0000], dtype=float64)"));
    CHECK_EQ(Tensor::from_vector(std::vector<int32_t>{1, -10, 100}).to_string(),
             std::string("tensor([  1, -10, 100], dtype=int32)"));
    CHECK_EQ(Tensor::arange(8).reshape({2, 2, 2}).to_string(),
             std::string("tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], dtype=int32)"));
    CHECK_EQ(Tensor::from_vector(std::vector<float>{1e-5f, 1}).to_string(),
             std::string("tensor([1.0000e-05, 1.0000e+00])"));
    CHECK_EQ(Tensor::zeros({3}).to_string(), std::string("tensor([0., 0., 0.])"));
    CHECK_EQ(Tensor::from_vector(std::vector<float>{-0.5f, 0.25f}).to_string(), std::string("tensor([-0.5000,  0.2500])"));
    Tensor special = Tensor::from_vector(std::vector<float>{1, INFINITY, NAN});
    CHECK_EQ(special.to_string(), std::string("tensor([1., inf, nan])"));
    CHECK_EQ(Tensor::zeros({0}).to_string(), std::string("tensor([])"));
}

TEST(ops_print_wrapping) {
    // a long vector wraps at 80 columns with an 8-space indent, like PyTorch
    CHECK_EQ(Tensor::arange(30.0).to_string(),
             std::string("tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
                         "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
                         "        28., 29.])"));
    // rows of a matrix: PyTorch fits floor((80 - 8) / (width + 2)) = 9 elements of width 6 per line
    Tensor m = Tensor::full({2, 10}, 0.5);
    std::string row = "0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000,\n         0.5000";
    CHECK_EQ(m.to_string(), "tensor([[" + row + "],\n        [" + row + "]])");
}

TEST(ops_print_sci_int_valued) {
    // PyTorch uses scientific notation for integer-valued floats too when max/min > 1000
    CHECK_EQ(Tensor::from_vector(std::vector<float>{1, 2000}).to_string(),
             std::string("tensor([1.0000e+00, 2.0000e+03])"));
    CHECK_EQ(Tensor::from_vector(std::vector<float>{10, 2000}).to_string(), std::string("tensor([  10., 2000.])"));
}

TEST(ops_print_summarized) {
    // more than 1000 elements: first and last three, with PyTorch's " ..." element
    CHECK_EQ(Tensor::arange(2000).to_string(),
             std::string("tensor([   0,    1,    2,  ..., 1997, 1998, 1999], dtype=int32)"));
    // rows are elided with a "..." line
    CHECK_EQ(Tensor::arange(2000).reshape({1000, 2}).to_string(),
             std::string("tensor([[   0,    1],\n        [   2,    3],\n        [   4,    5],\n        ...,\n"
                         "        [1994, 1995],\n        [1996, 1997],\n        [1998, 1999]], dtype=int32)"));
    // the format is chosen from the elements shown, not the elided middle
    std::vector<float> ones(2000, 1.0f);
    ones[1000] = 123456;
    CHECK_EQ(Tensor::from_vector(ones).to_string(), std::string("tensor([1., 1., 1.,  ..., 1., 1., 1.])"));
}

// sort and argsort against std::stable_sort: ties keep their order, NaN above +∞ (first when
// descending); along a middle axis of odd length (padded inside), of floats and of integers
TEST(ops_sort_argsort) {
    std::vector<float> xv = randf(3 * 13 * 2, 181, -2, 2);
    for (size_t i = 0; i < xv.size(); i += 4) xv[i] = 0.5f;   // ties
    xv[5] = NAN;
    xv[9] = -INFINITY;
    xv[16] = INFINITY;
    std::vector<int32_t> iv = randi(3 * 13 * 2, 182, -4, 4);
    for (bool ints : {false, true})
        for (bool descending : {false, true}) {
            Tensor x = ints ? Tensor::from_vector(iv, {3, 13, 2})
                            : Tensor::from_vector(xv, {3, 13, 2});
            auto [values, indices] = x.sort(1, descending);
            CHECK(values.shape() == S({3, 13, 2}) && values.dtype() == x.dtype());
            CHECK(indices.dtype() == DType::INT64);
            std::vector<int64_t> got = indices.to_vector<int64_t>();
            CHECK(got == x.argsort(-2, descending).to_vector<int64_t>());
            Vec got_values = vals(values), want_values;
            std::vector<int64_t> want;
            for (int a = 0; a < 3; a++)
                for (int c = 0; c < 2; c++) {
                    auto at = [&](int64_t j) {
                        size_t k = size_t((a * 13 + j) * 2 + c);
                        return ints ? double(iv[k]) : double(xv[k]);
                    };
                    auto rank = [&](int64_t j) {   // NaN the largest
                        double v = at(j);
                        return std::isnan(v) ? INFINITY : descending ? -v : v;
                    };
                    auto tier = [&](int64_t j) { return std::isnan(at(j)) ? (descending ? -1 : 1) : 0; };
                    std::vector<int64_t> order(13);
                    for (int64_t j = 0; j < 13; j++) order[size_t(j)] = j;
                    std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
                        return tier(p) != tier(q) ? tier(p) < tier(q) : rank(p) < rank(q);
                    });
                    for (int64_t j = 0; j < 13; j++) {
                        size_t k = size_t((a * 13 + j) * 2 + c);
                        CHECK_EQ(got[k], order[size_t(j)]);
                        double g = got_values[k], w = at(order[size_t(j)]);
                        CHECK(g == w || (std::isnan(g) && std::isnan(w)));
                    }
                }
        }
    // a 0-d tensor, and a bool row
    CHECK_EQ(Tensor::full({}, 3.0).sort().indices.to_vector<int64_t>()[0], int64_t(0));
    Tensor flags = Tensor::from_vector(std::vector<int32_t>{1, 0, 1, 0}) != 0;
    CHECK(flags.argsort().to_vector<int64_t>() == (std::vector<int64_t>{1, 3, 0, 2}));
    CHECK_THROWS(Tensor::zeros({2, 3}).sort(2), "sort", "axis 2", "[2,3]");
}

// x.max(axis) / x.min(axis) give values and indices (torch.return_types); topk in order
TEST(ops_max_min_indices_topk) {
    std::vector<float> xv = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    Tensor x = Tensor::from_vector(xv, {3, 4});
    auto [values, indices] = x.max(1);
    CHECK(values.shape() == S({3}) && indices.dtype() == DType::INT64);
    CHECK_ALL_NEAR(vals(values), (Vec{4, 9, 8}), 0);
    CHECK(indices.to_vector<int64_t>() == (std::vector<int64_t>{2, 1, 3}));
    tg::ValuesIndices mn = x.min(0, true);
    CHECK(mn.values.shape() == S({1, 4}) && mn.indices.shape() == S({1, 4}));
    CHECK_ALL_NEAR(vals(mn.values), (Vec{3, 1, 2, 1}), 0);
    CHECK(mn.indices.to_vector<int64_t>() == (std::vector<int64_t>{0, 0, 1, 0}));   // first tie
    // it is the values tensor where a tensor is expected
    Tensor shifted = x - x.max(1, true);
    CHECK_ALL_NEAR(vals(shifted), (Vec{-1, -3, 0, -3, -4, 0, -7, -3, -3, -5, -3, 0}), 0);
    CHECK_ALL_NEAR(vals(x.max(-1).exp()), (Vec{std::exp(4.0), std::exp(9.0), std::exp(8.0)}),
                   F32);

    // topk against a stable sort in double, largest and smallest, over each axis
    std::vector<float> rv = randf(5 * 7 * 6, 131, -4, 4);
    rv[3] = rv[9];   // a tie
    Tensor r = Tensor::from_vector(rv, {5, 7, 6});
    for (int axis = 0; axis < 3; axis++)
        for (bool largest : {true, false}) {
            Shape s = {5, 7, 6};
            int64_t n = s[size_t(axis)], k = std::min<int64_t>(3, n);
            tg::ValuesIndices t = r.topk(k, axis, largest);
            Shape out = s;
            out[size_t(axis)] = k;
            CHECK(t.values.shape() == out && t.indices.shape() == out);
            Vec tv = vals(t.values);
            std::vector<int64_t> ti = t.indices.to_vector<int64_t>();
            for (int64_t flat = 0; flat < count(out); flat++) {
                Idx at = unravel(flat, out);
                std::vector<std::pair<double, int64_t>> line;
                for (int64_t j = 0; j < n; j++) {
                    Idx src = at;
                    src[size_t(axis)] = j;
                    double v = rv[size_t(ravel(src, s))];
                    line.push_back({largest ? -v : v, j});
                }
                std::stable_sort(line.begin(), line.end(),
                                 [](auto& a, auto& b) { return a.first < b.first; });
                int64_t rank = at[size_t(axis)];
                CHECK_EQ(ti[size_t(flat)], line[size_t(rank)].second);
                CHECK_EQ(tv[size_t(flat)], largest ? -line[size_t(rank)].first
                                                   : line[size_t(rank)].first);
            }
        }
    // NaN ranks above +inf: first for the largest, last for the smallest; ints; k = 0 and n
    Tensor nanx = Tensor::from_vector({1.f, NAN, INFINITY, -INFINITY, 2.f});
    CHECK(nanx.topk(3).indices.to_vector<int64_t>() == (std::vector<int64_t>{1, 2, 4}));
    CHECK(nanx.topk(5, 0, false).indices.to_vector<int64_t>() ==
          (std::vector<int64_t>{3, 0, 4, 2, 1}));
    Tensor iv = Tensor::from_vector({7, -3, 7, 2147483647, -2147483647 - 1});
    tg::ValuesIndices ti = iv.topk(4);
    CHECK(ti.values.dtype() == DType::INT32);
    CHECK(ti.values.to_vector<int64_t>() == (std::vector<int64_t>{2147483647, 7, 7, -3}));
    CHECK(ti.indices.to_vector<int64_t>() == (std::vector<int64_t>{3, 0, 2, 1}));
    CHECK(iv.topk(2, 0, false).indices.to_vector<int64_t>() == (std::vector<int64_t>{4, 1}));
    CHECK(x.topk(0, 1).values.shape() == S({3, 0}));
    CHECK(x.topk(4, 1).indices.to_vector<int64_t>() ==
          (std::vector<int64_t>{2, 0, 1, 3, 1, 3, 0, 2, 3, 0, 2, 1}));
    CHECK_THROWS(x.topk(5, 1), "topk", "k = 5", "[0, 4]", "[3,4]");
    CHECK_THROWS(x.topk(1, 2), "topk", "axis 2", "[3,4]");
}

// cumsum against running sums in double: short rows (a triangle) and long ones (blocks)
TEST(ops_cumsum) {
    for (int64_t n : {1, 5, 256, 257, 1000, 70000}) {
        std::vector<float> xv = randf(size_t(2 * n), uint64_t(140 + n), -1, 1);
        Tensor x = Tensor::from_vector(xv, {2, n});
        Tensor c1 = x.cumsum(1), c0 = x.cumsum(0);
        tg::realize({c1, c0});
        Vec w1, w0;
        for (int r = 0; r < 2; r++) {
            double run = 0;
            for (int64_t j = 0; j < n; j++) w1.push_back(run += xv[size_t(r * n + j)]);
        }
        for (int r = 0; r < 2; r++)
            for (int64_t j = 0; j < n; j++)
                w0.push_back(xv[size_t(j)] + (r ? xv[size_t(n + j)] : 0.0));
        CHECK(c1.shape() == S({2, n}) && c1.dtype() == DType::FLOAT32);
        // float32 sums of n terms of size <= 1: error grows like sqrt(n) ulps of the total
        CHECK_ALL_NEAR(vals(c1), w1, 1e-6 * std::sqrt(double(n)) * 10);
        CHECK_ALL_NEAR(vals(c0), w0, F32);
    }
    // integers sum exactly in int64; bools count; a 0-d tensor is itself
    Tensor ci = Tensor::from_vector({2147483647, 2147483647, -5}).cumsum(0);
    CHECK(ci.dtype() == DType::INT64);
    CHECK(ci.to_vector<int64_t>() == (std::vector<int64_t>{2147483647, 4294967294, 4294967289}));
    CHECK(Tensor::from_vector({true, false, true}).cumsum(0).to_vector<int64_t>() ==
          (std::vector<int64_t>{1, 1, 2}));
    CHECK_EQ(Tensor::full({}, 3.5).cumsum(0).item(), 3.5);
    // an infinity stays where it is (no 0·∞ in the triangle)
    Vec inf = vals(Tensor::from_vector({1.f, INFINITY, 1.f}).cumsum(0));
    CHECK(inf[0] == 1 && std::isinf(inf[1]) && std::isinf(inf[2]));
    CHECK_THROWS(Tensor::zeros({2, 3}).cumsum(2), "cumsum", "axis 2", "[2,3]");
}

TEST(ops_cumprod) {
    // values near ±1 keep the products in range; a zero mid-row zeroes the rest
    for (int64_t n : {1, 2, 7, 64, 100}) {
        std::vector<float> xv = randf(size_t(3 * n), uint64_t(190 + n), 0.8, 1.25);
        for (size_t i = 0; i < xv.size(); i += 3) xv[i] = -xv[i];
        if (n > 5) xv[size_t(n + 4)] = 0;
        Tensor x = Tensor::from_vector(xv, {3, n});
        Tensor c1 = x.cumprod(1), c0 = x.cumprod(-2);
        Vec w1, w0(size_t(3 * n));
        for (int r = 0; r < 3; r++) {
            double run = 1;
            for (int64_t j = 0; j < n; j++) w1.push_back(run *= xv[size_t(r * n + j)]);
        }
        for (int64_t j = 0; j < n; j++) {
            double run = 1;
            for (int r = 0; r < 3; r++) w0[size_t(r * n + j)] = run *= xv[size_t(r * n + j)];
        }
        CHECK(c1.shape() == S({3, n}) && c1.dtype() == DType::FLOAT32);
        CHECK_ALL_NEAR(vals(c1), w1, 1e-6 * double(n));
        CHECK_ALL_NEAR(vals(c0), w0, F32);
    }
    // integers in int64, exactly; a 0-d tensor is itself
    Tensor ci = Tensor::from_vector({100000, 100000, -3}).cumprod(0);
    CHECK(ci.dtype() == DType::INT64);
    CHECK(ci.to_vector<int64_t>() == (std::vector<int64_t>{100000, 10000000000, -30000000000}));
    CHECK_EQ(Tensor::full({}, 3.5).cumprod(0).item(), 3.5);
    CHECK_THROWS(Tensor::zeros({2, 3}).cumprod(2), "cumprod", "axis 2", "[2,3]");
}

// % is Python's remainder (the divisor's sign); floor, ceil, trunc as C's
// float % is fmod's, moved by b where the signs differ, exactly (PyTorch's): whole multiples
// give 0, and a quotient far past 2^24 still leaves the exact remainder
TEST(ops_remainder_of_whole_multiples_and_large_quotients) {
    std::vector<float> a, b;
    for (int i = 1; i <= 300; i++)
        for (int k : {-3, -1, 1, 2, 5}) a.push_back(float(i * k)), b.push_back(float(i));
    for (float big : {1e10f, -1e10f, 3e7f, 1e5f, -2.5e12f})
        for (float d : {3.3f, 6.2831855f, -0.7f}) a.push_back(big), b.push_back(d);
    Vec got = vals(Tensor::from_vector(a) % Tensor::from_vector(b)), want;
    for (size_t i = 0; i < a.size(); i++) {
        float m = std::fmod(a[i], b[i]);   // exact
        want.push_back(m != 0 && ((m < 0) != (b[i] < 0)) ? double(m + b[i]) : double(m));
    }
    CHECK_ALL_NEAR(got, want, 0);
    Tensor x = Tensor::from_vector({7.5f, -7.5f, 40.f}).requires_grad();
    (x % Tensor::from_vector({2.f, 2.f, 8.f})).sum().backward();
    CHECK_ALL_NEAR(vals(x.grad()), (Vec{1, 1, 1}), 0);
}

// round (halves to even, a zero with x's sign), tan, fmod (C's, x's sign), isnan, isinf,
// isfinite and nan_to_num against the C library, special values too
TEST(ops_round_tan_fmod_and_tests_of_special_values) {
    std::vector<float> xv = {2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -0.4f, 0.49999997f, 7.2f,
                             -7.7f, 8388609.0f, 1e30f, -0.f, INFINITY, -INFINITY, NAN};
    Tensor x = Tensor::from_vector(xv);
    Vec r = vals(x.round()), t = vals(x.tan());
    for (size_t i = 0; i < xv.size(); i++) {
        double want = std::nearbyint(double(xv[i]));   // to even, in the default mode
        bool same = std::isnan(want) ? std::isnan(r[i])
                                     : r[i] == want && std::signbit(r[i]) == std::signbit(want);
        if (!same) th::report(__FILE__, __LINE__, "round(" + std::to_string(xv[i]) + ")");
        double tw = std::tan(double(xv[i]));
        if (std::isfinite(tw) && std::fabs(tw) < 1e3) CHECK_NEAR(t[i], tw, 1e-5 * (1 + std::fabs(tw)));
    }
    CHECK(Tensor::from_vector({3, -4}).round().dtype() == DType::INT32);
    std::vector<bool> nan, inf, fin;
    for (float v : xv) nan.push_back(std::isnan(v)), inf.push_back(std::isinf(v)),
                       fin.push_back(std::isfinite(v));
    CHECK(x.isnan().to_vector<bool>() == nan);
    CHECK(x.isinf().to_vector<bool>() == inf);
    CHECK(x.isfinite().to_vector<bool>() == fin);
    CHECK(x.isnan().dtype() == DType::BOOL);
    Tensor ints = Tensor::from_vector({1, -2});
    CHECK(ints.isnan().to_vector<bool>() == (std::vector<bool>{false, false}));
    CHECK(ints.isinf().to_vector<bool>() == (std::vector<bool>{false, false}));
    CHECK(ints.isfinite().to_vector<bool>() == (std::vector<bool>{true, true}));
    Vec n = vals(x.nan_to_num()), n2 = vals(x.nan_to_num(-1, 5, -6));
    CHECK_EQ(n[13], double(std::numeric_limits<float>::max()));
    CHECK_EQ(n[14], -double(std::numeric_limits<float>::max()));
    CHECK_EQ(n[15], 0.0);
    CHECK_ALL_NEAR((Vec{n2[13], n2[14], n2[15], n2[8]}), (Vec{5, -6, -1, 7.2}), 1e-6);
    std::vector<float> a = {7, -7, 7, -7, 5.5f, -6, 1e10f, -1e10f, 3, -3, INFINITY, 0},
                       b = {3, 3, -3, -3, 2, 3, 3.3f, 6.2831855f, INFINITY, INFINITY, 2, 0};
    Vec f = vals(Tensor::from_vector(a).fmod(Tensor::from_vector(b)));
    for (size_t i = 0; i < a.size(); i++) {
        double want = std::fmod(a[i], b[i]);
        bool same = std::isnan(want) ? std::isnan(f[i]) : f[i] == want;
        if (!same) th::report(__FILE__, __LINE__, "fmod at " + std::to_string(i));
    }
    CHECK(Tensor::from_vector({-7, 7}).fmod(3).to_vector<int64_t>() ==
          (std::vector<int64_t>{-1, 1}));
    CHECK_THROWS(Tensor::from_vector({true}).fmod(Tensor::from_vector({true})), "fmod", "bool");
}

// Inverse trigonometric and hyperbolic functions against the C library's, in float64 (within
// 4 ulp) and float32 (within 2 ulp of float32 of the exact value), with special values; sinh
// and cosh as exp, whose error grows with |x| (x/ln 2 is rounded); their gradients against the
// derivatives' formulas
TEST(ops_inverse_trig_and_hyperbolic_match_c) {
    Vec grid;
    for (double v = -3; v <= 3.0001; v += 0.0625) grid.push_back(v);
    for (double v : {1e-30, 1e-8, 3e-4, 0.2679, 0.2680, 0.4999, 0.5, 0.5001, 0.9999, 0.99999999,
                     1.0, 1.0000001, 7.5, 123.25, 1e6, 1e17, 1e19, 1e300})
        grid.push_back(v), grid.push_back(-v);
    for (double v : Vec{0.0, -0.0, INFINITY, -INFINITY, NAN}) grid.push_back(v);
    struct Fn {
        const char* name;
        Tensor (Tensor::*ours)(tg::Loc) const;
        double (*c)(double);
        bool as_exp = false;
    };
    const Fn fns[] = {{"atan", &Tensor::atan, [](double v) { return std::atan(v); }},
                      {"asin", &Tensor::asin, [](double v) { return std::asin(v); }},
                      {"acos", &Tensor::acos, [](double v) { return std::acos(v); }},
                      {"sinh", &Tensor::sinh, [](double v) { return std::sinh(v); }, true},
                      {"cosh", &Tensor::cosh, [](double v) { return std::cosh(v); }, true},
                      {"asinh", &Tensor::asinh, [](double v) { return std::asinh(v); }},
                      {"acosh", &Tensor::acosh, [](double v) { return std::acosh(v); }},
                      {"atanh", &Tensor::atanh, [](double v) { return std::atanh(v); }},
                      {"log10", &Tensor::log10, [](double v) { return std::log10(v); }}};
    auto same = [](double got, double want, double ulp) {
        if (std::isnan(want)) return std::isnan(got);
        if (std::isinf(want) || want == 0) return got == want && std::signbit(got) == std::signbit(want);
        return std::fabs(got - want) <= ulp * std::fabs(want);
    };
    for (const Fn& f : fns) {
        Vec got64 = vals((Tensor::from_vector(grid).*f.ours)(tg::Loc::here()));
        std::vector<float> grid32(grid.begin(), grid.end());
        Vec got32 = vals((Tensor::from_vector(grid32).*f.ours)(tg::Loc::here()));
        for (size_t i = 0; i < grid.size(); i++) {
            double want64 = f.c(grid[i]), want32 = f.c(double(grid32[i]));
            double ulps = f.as_exp ? 4 + 2 * std::fabs(grid[i]) : 4;
            bool in_float = std::fabs(want32) < 3e38 && (want32 == 0 || std::fabs(want32) > 1e-37);
            if (!same(got64[i], want64, ulps * 2.2e-16))
                th::report(__FILE__, __LINE__, std::string(f.name) + "(" + std::to_string(grid[i]) +
                                                   ") float64: " + th::show(got64[i]) + " != " +
                                                   th::show(want64));
            if (in_float && !same(got32[i], float(want32), ulps / 2 * 1.2e-7))
                th::report(__FILE__, __LINE__, std::string(f.name) + "(" + std::to_string(grid32[i]) +
                                                   ") float32: " + th::show(got32[i]) + " != " +
                                                   th::show(want32));
        }
    }
    // atan2 over every pair of signs, zeros and infinities, and a grid
    Vec ys, xs;
    Vec edge = {0.0, -0.0, 1.0, -1.0, 2.5, -1e-300, INFINITY, -INFINITY, NAN};
    for (double y : edge)
        for (double x : edge) ys.push_back(y), xs.push_back(x);
    for (double y = -2; y <= 2; y += 0.375)
        for (double x = -2; x <= 2; x += 0.3125) ys.push_back(y), xs.push_back(x);
    Vec a2 = vals(Tensor::from_vector(ys).atan2(Tensor::from_vector(xs)));
    for (size_t i = 0; i < ys.size(); i++)
        if (!same(a2[i], std::atan2(ys[i], xs[i]), 4 * 2.2e-16))
            th::report(__FILE__, __LINE__, "atan2(" + th::show(ys[i]) + ", " + th::show(xs[i]) +
                                               "): " + th::show(a2[i]));
    CHECK(Tensor::from_vector({1, 2}).atan2(Tensor::from_vector({1, 2})).dtype() == DType::FLOAT32);
    // gradients: 1/(1 + x²), ±1/√(1 - x²), cosh, sinh, 1/√(x² + 1), 1/√(x² - 1), 1/(1 - x²)
    Vec pts = {-0.9, -0.5, -0.3, 0.0, 0.2, 0.5, 0.7, 0.95};
    auto grad_of = [&](Tensor (Tensor::*fn)(tg::Loc) const, const Vec& at) {
        Tensor x = Tensor::from_vector(at).requires_grad();
        (x.*fn)(tg::Loc::here()).sum().backward();
        return vals(x.grad());
    };
    Vec ga = grad_of(&Tensor::atan, pts), gs = grad_of(&Tensor::asin, pts),
        gc = grad_of(&Tensor::acos, pts), gsh = grad_of(&Tensor::sinh, pts),
        gch = grad_of(&Tensor::cosh, pts), gash = grad_of(&Tensor::asinh, pts),
        gath = grad_of(&Tensor::atanh, pts);
    for (size_t i = 0; i < pts.size(); i++) {
        double v = pts[i];
        CHECK_NEAR(ga[i], 1 / (1 + v * v), 1e-14);
        CHECK_NEAR(gs[i], 1 / std::sqrt(1 - v * v), 1e-14);
        CHECK_NEAR(gc[i], -1 / std::sqrt(1 - v * v), 1e-14);
        CHECK_NEAR(gsh[i], std::cosh(v), 1e-14);
        CHECK_NEAR(gch[i], std::sinh(v), 1e-14);
        CHECK_NEAR(gash[i], 1 / std::sqrt(v * v + 1), 1e-14);
        CHECK_NEAR(gath[i], 1 / (1 - v * v), 1e-14);
    }
    // near 0 and at the ends, as PyTorch's: cosh' = sinh keeps its precision, atanh' is ∞ at ±1
    Vec tiny = grad_of(&Tensor::cosh, {1e-14, -3e-9, 1e-5});
    CHECK_ALL_NEAR(tiny, (Vec{1e-14, -3e-9, std::sinh(1e-5)}), 1e-15);
    Vec ends = grad_of(&Tensor::atanh, {1.0, -1.0});
    CHECK(ends[0] == INFINITY && ends[1] == INFINITY);
    Vec gah = grad_of(&Tensor::acosh, {1.5, 2.0, 10.0});
    CHECK_ALL_NEAR(gah, (Vec{1 / std::sqrt(1.25), 1 / std::sqrt(3.0), 1 / std::sqrt(99.0)}), 1e-14);
    Tensor y = Tensor::from_vector(Vec{1.0, -2.0, 0.5, 3.0}).requires_grad();
    Tensor x = Tensor::from_vector(Vec{2.0, 0.0, -1.5, -0.25}).requires_grad();
    y.atan2(x).sum().backward();
    Vec gy = vals(y.grad()), gx = vals(x.grad());
    Vec yv = {1.0, -2.0, 0.5, 3.0}, xv = {2.0, 0.0, -1.5, -0.25};
    for (size_t i = 0; i < 4; i++) {
        double r2 = xv[i] * xv[i] + yv[i] * yv[i];
        CHECK_NEAR(gy[i], xv[i] / r2, 1e-14);
        CHECK_NEAR(gx[i], -yv[i] / r2, 1e-14);
    }
    // no NaN where the other branches' values would be infinite
    Vec edges = grad_of(&Tensor::asin, {1.0, -1.0, 0.0});
    CHECK(std::isinf(edges[0]) && std::isinf(edges[1]) && edges[2] == 1);
    CHECK(grad_of(&Tensor::atan, {INFINITY, 0.0}) == (Vec{0, 1}));
}

// erf and erfc against the C library's: relative errors within 1e-14 in float64 (erfc's also
// grow as exp's do, with x²) and a few float32 ulp; their gradients against (2/√π)·e^(-x²)
TEST(ops_erf_erfc_match_c) {
    Vec grid;
    for (double v = -6; v <= 6.0001; v += 0.03125) grid.push_back(v);
    for (double v : {1e-300, 1e-20, 1e-8, 0.4999999, 0.5, 0.5000001, 9.5, 12.0, 26.5, 27.5, 40.0})
        grid.push_back(v), grid.push_back(-v);
    for (double v : Vec{0.0, -0.0, INFINITY, -INFINITY, NAN}) grid.push_back(v);
    std::vector<float> grid32(grid.begin(), grid.end());
    Tensor x64 = Tensor::from_vector(grid), x32 = Tensor::from_vector(grid32);
    Vec erf64 = vals(x64.erf()), erfc64 = vals(x64.erfc()), erf32 = vals(x32.erf()),
        erfc32 = vals(x32.erfc());
    auto check = [](const char* what, double v, double got, double want, double tol) {
        bool ok = std::isnan(want) ? std::isnan(got)
                  : want == 0 ? got == want && std::signbit(got) == std::signbit(want)
                              : std::fabs(got - want) <= tol * std::fabs(want);
        if (!ok)
            th::report(__FILE__, __LINE__, std::string(what) + "(" + th::show(v) + "): " +
                                               th::show(got) + " != " + th::show(want));
    };
    for (size_t i = 0; i < grid.size(); i++) {
        double v = grid[i], f = grid32[i];
        check("erf float64", v, erf64[i], std::erf(v), 1e-14);
        check("erfc float64", v, erfc64[i], std::erfc(v), 1e-14 + 4e-16 * v * v);
        check("erf float32", f, erf32[i], double(float(std::erf(f))), 4 * 1.2e-7);
        double want = std::erfc(f);
        if (want > 1e-37) check("erfc float32", f, erfc32[i], double(float(want)), (8 + f * f) * 1.2e-7);
    }
    Vec pts = {-30, -4, -1.5, -0.5, -0.3, 0, 0.25, 0.5, 0.75, 2, 5, 30};
    for (bool f32 : {false, true}) {
        Tensor x = Tensor::from_vector(pts);
        if (f32) x = x.cast(DType::FLOAT32);
        x = x.detach().requires_grad();
        Tensor ge = tg::gradients(x.erf().sum(), {x})[0], gc = tg::gradients(x.erfc().sum(), {x})[0];
        Vec gev = vals(ge), gcv = vals(gc);
        for (size_t i = 0; i < pts.size(); i++) {
            double slope = 2 / std::sqrt(M_PI) * std::exp(-pts[i] * pts[i]);
            CHECK_NEAR(gev[i], slope, f32 ? 5e-7 : 3e-13);
            CHECK_NEAR(gcv[i], -slope, f32 ? 5e-7 : 3e-13);
        }
    }
    // gelu keeps its precision far below 0, where 1 + erf would cancel
    Vec g = vals(Tensor::from_vector(Vec{-8.0, -3.0, 1.0}).gelu());
    for (size_t i = 0; i < 3; i++) {
        double v = Vec{-8.0, -3.0, 1.0}[i];
        CHECK_NEAR(g[i] / (0.5 * v * std::erfc(-v / std::sqrt(2.0))), 1, 1e-13);
    }
}

// xlogy and logit: values and gradients as PyTorch 1.13 gave on these inputs (xlogy's gradient
// in y at x = 0, y = 0 is 0 here, NaN there)
TEST(ops_xlogy_and_logit_as_pytorch) {
    Tensor x = Tensor::from_vector(Vec{0, 0, 0, 2, -1.5, 3, 0, 1}).requires_grad();
    Tensor y = Tensor::from_vector(Vec{0, -1, 2.5, 0.5, 4, 0, NAN, -2}).requires_grad();
    Tensor v = x.xlogy(y);
    v.sum().backward();
    auto same = [](const Vec& got, const Vec& want) {
        bool ok = got.size() == want.size();
        for (size_t i = 0; ok && i < got.size(); i++)
            ok = std::isnan(want[i]) ? std::isnan(got[i])
                 : std::isinf(want[i]) ? got[i] == want[i]
                                       : std::fabs(got[i] - want[i]) <= 1e-14 * (1 + std::fabs(want[i]));
        return ok;
    };
    CHECK(same(vals(v), {0, 0, 0, -1.3862943611198906, -2.0794415416798357, -INFINITY, NAN, NAN}));
    CHECK(same(vals(x.grad()), {0, 0, 0.9162907318741551, -0.6931471805599453, 1.3862943611198906,
                                -INFINITY, NAN, NAN}));
    CHECK(same(vals(y.grad()), {0, 0, 0, 4, -0.375, INFINITY, NAN, -0.5}));
    CHECK(Tensor::from_vector({1, 2}).xlogy(Tensor::from_vector({3, 4})).dtype() == DType::FLOAT32);
    Vec pv = {0, 1e-8, 0.25, 0.5, 0.9, 1, 1.5};
    Tensor p = Tensor::from_vector(pv).requires_grad();
    Tensor l = p.logit();
    l.sum().backward();
    CHECK(same(vals(l), {-INFINITY, -18.420680733952366, -1.0986122886681098, 0, 2.1972245773362196,
                         INFINITY, NAN}));
    Vec gp = vals(p.grad());   // at 1.5 (NaN), the formula's gradient: not compared
    CHECK(same(Vec(gp.begin(), gp.end() - 1), {INFINITY, 100000001.00000001, 5.333333333333333, 4,
                                               11.111111111111112, INFINITY}));
    Tensor q = Tensor::from_vector(pv).requires_grad();
    Tensor le = q.logit(1e-3);
    le.sum().backward();
    CHECK(same(vals(le), {-6.906754778648554, -6.906754778648554, -1.0986122886681098, 0,
                          2.1972245773362196, 6.906754778648553, 6.906754778648553}));
    CHECK(same(vals(q.grad()), {0, 0, 5.333333333333333, 4, 11.111111111111112, 0, 0}));
}

// nonzero (argwhere), masked_select and unique, as PyTorch's: coordinates in row-major order,
// NaN counts as nonzero; masked_select broadcasts and its gradient goes back to the picks
TEST(ops_nonzero_masked_select_unique) {
    Tensor x = Tensor::from_vector(std::vector<float>{0, 1.5f, 0, NAN, -2, 0}, {2, 3});
    Tensor nz = x.nonzero();
    CHECK_EQ(nz.shape(), (tg::Shape{3, 2}));
    CHECK(nz.dtype() == DType::INT64);
    CHECK(nz.to_vector<int64_t>() == (std::vector<int64_t>{0, 1, 1, 0, 1, 1}));
    CHECK(x.argwhere().to_vector<int64_t>() == nz.to_vector<int64_t>());
    CHECK_EQ(Tensor::zeros({2, 2}).nonzero().shape(), (tg::Shape{0, 2}));
    CHECK_EQ(Tensor::from_vector(std::vector<int32_t>{7}, {}).nonzero().shape(), (tg::Shape{1, 0}));
    CHECK(Tensor::from_vector(std::vector<bool>{false, true, true}).nonzero().to_vector<int64_t>() ==
          (std::vector<int64_t>{1, 2}));
    Tensor v = Tensor::from_vector(Vec{1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad();
    Tensor row_mask = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
    Tensor picked = v.masked_select(row_mask);   // the mask broadcast over both rows
    CHECK_ALL_NEAR(vals(picked), (Vec{1, 3, 4, 6}), 0);
    (picked * Tensor::from_vector(Vec{1, 2, 3, 4})).sum().backward();
    CHECK_ALL_NEAR(vals(v.grad()), (Vec{1, 0, 2, 3, 0, 4}), 0);
    CHECK_ALL_NEAR(vals(v.masked_select(v > 2.5)), (Vec{3, 4, 5, 6}), 0);
    CHECK_EQ(v.masked_select(v > 9).shape(), (tg::Shape{0}));
    // unique: sorted, each NaN its own and last; integers exact beyond 2^53
    Tensor u = Tensor::from_vector(std::vector<float>{3, NAN, -1, 3, 0, NAN, -1, 3}, {2, 4});
    auto [values, inverse, counts] = u.unique();
    Vec uv = vals(values);
    CHECK_EQ(uv.size(), size_t(5));
    CHECK_ALL_NEAR(Vec(uv.begin(), uv.begin() + 3), (Vec{-1, 0, 3}), 0);
    CHECK(std::isnan(uv[3]) && std::isnan(uv[4]) && values.dtype() == DType::FLOAT32);
    CHECK_EQ(inverse.shape(), (tg::Shape{2, 4}));
    CHECK(inverse.to_vector<int64_t>() == (std::vector<int64_t>{2, 3, 0, 2, 1, 4, 0, 2}));
    CHECK(counts.to_vector<int64_t>() == (std::vector<int64_t>{2, 1, 3, 1, 1}));
    int64_t big = (int64_t(1) << 53) + 1;
    tg::Unique ui = Tensor::from_vector(std::vector<int64_t>{big, big - 1, big}).unique();
    CHECK(ui.values.to_vector<int64_t>() == (std::vector<int64_t>{big - 1, big}));
    CHECK(ui.counts.to_vector<int64_t>() == (std::vector<int64_t>{1, 2}));
    CHECK_EQ(Tensor::zeros({0}).unique().values.shape(), (tg::Shape{0}));
    CHECK_THROWS(v.masked_select(Tensor::ones({3})), "masked_select", "float32", "bool");
    CHECK_THROWS(v.masked_select(Tensor::ones({2}, DType::BOOL)), "masked_select", "[2,3]", "[2]");
}

// floor_divide as PyTorch 1.13 gave on these values (Python's //): a float quotient just off
// a whole number, signs, zeros and infinities; integers in C's types, x // 0 is 0 and
// MIN // -1 wraps (PyTorch raises, or traps)
TEST(ops_floor_divide_as_python) {
    Tensor a = Tensor::from_vector({1.f, 7.f, -7.f, 7.5f, -0.5f, 0.5f, 0.f, 5.f, -5.f, 0.f, 1e10f,
                                    -3.f});
    Tensor b = Tensor::from_vector({0.1f, 2.f, 2.f, -2.f, 1.f, -1.f, -3.f, 0.f, 0.f, 0.f, 3.3f,
                                    INFINITY});
    Vec q = vals(a.floor_divide(b));
    Vec want = {9, 3, -4, -4, -1, -1, -0.0, INFINITY, -INFINITY, NAN, 3030302976.0, -1};
    for (size_t i = 0; i < want.size(); i++) {
        bool same = std::isnan(want[i]) ? std::isnan(q[i])
                                        : q[i] == want[i] && std::signbit(q[i]) == std::signbit(want[i]);
        if (!same) th::report(__FILE__, __LINE__, "floor_divide at " + std::to_string(i));
    }
    Tensor ai = Tensor::from_vector({7, -7, 7, -7, 0, 5, INT32_MIN, 3});
    Tensor bi = Tensor::from_vector({2, 2, -2, -2, 3, 0, -1, 3});
    Tensor qi = ai.floor_divide(bi);
    CHECK(qi.dtype() == DType::INT32);
    CHECK(qi.to_vector<int64_t>() ==
          (std::vector<int64_t>{3, -4, -4, 3, 0, 0, INT32_MIN, 1}));
    CHECK(Tensor::from_vector({-7, 7}).floor_divide(2.0).to_vector<float>() ==
          (std::vector<float>{-4, 3}));
    Tensor yes = Tensor::from_vector({true});
    CHECK_THROWS(yes.floor_divide(yes), "floor_divide", "bool");
}

TEST(ops_remainder_floor_ceil_trunc) {
    std::vector<int32_t> a = {-7, 7, -7, 7, 0, 6, -6, 5}, b = {3, -3, -3, 3, 4, 3, 3, 0};
    Tensor ri = Tensor::from_vector(a) % Tensor::from_vector(b);
    CHECK(ri.dtype() == DType::INT32);
    CHECK(ri.to_vector<int64_t>() == (std::vector<int64_t>{2, -2, -1, 1, 0, 0, 0, 0}));
    CHECK((Tensor::from_vector(a) % 4).to_vector<int64_t>() ==
          (std::vector<int64_t>{1, 3, 1, 3, 0, 2, 2, 1}));
    CHECK((9 % Tensor::from_vector({4, -4})).to_vector<int64_t>() ==
          (std::vector<int64_t>{1, -3}));
    std::vector<float> xv = randf(64, 151, -20, 20), yv = randf(64, 152, -3, 3);
    Tensor x = Tensor::from_vector(xv), y = Tensor::from_vector(yv);
    Tensor rf = x % y, rs = x % 2.5, fl = x.floor(), ce = x.ceil(), tr = x.trunc();
    tg::realize({rf, rs, fl, ce, tr});
    auto py_mod = [](double p, double q) {
        double m = std::fmod(p, q);
        return m != 0 && ((m < 0) != (q < 0)) ? m + q : m;
    };
    Vec wrf, wrs, wfl, wce, wtr;
    for (size_t i = 0; i < xv.size(); i++) {
        wrf.push_back(py_mod(xv[i], yv[i]));
        wrs.push_back(py_mod(xv[i], 2.5));
        wfl.push_back(std::floor(xv[i]));
        wce.push_back(std::ceil(xv[i]));
        wtr.push_back(std::trunc(xv[i]));
    }
    CHECK_ALL_NEAR(vals(rf), wrf, 1e-5);
    CHECK_ALL_NEAR(vals(rs), wrs, 1e-5);
    CHECK_ALL_NEAR(vals(fl), wfl, 0);
    CHECK_ALL_NEAR(vals(ce), wce, 0);
    CHECK_ALL_NEAR(vals(tr), wtr, 0);
    Vec rv = vals(rf);
    for (size_t i = 0; i < rv.size(); i++)   // in [0, y) or (y, 0]
        CHECK(yv[i] > 0 ? rv[i] >= 0 && rv[i] < yv[i] : rv[i] <= 0 && rv[i] > yv[i]);
    // special values: C's and PyTorch's
    Tensor sp = Tensor::from_vector({-0.5f, 0.5f, -0.f, 1e30f, -3e9f, INFINITY, NAN});
    Vec t = vals(sp.trunc()), f = vals(sp.floor()), c = vals(sp.ceil());
    std::vector<float> spv = {-0.5f, 0.5f, -0.f, 1e30f, -3e9f, INFINITY, NAN};
    for (size_t i = 0; i < spv.size(); i++) {
        for (auto [got, want] : {std::pair{t[i], std::trunc(double(spv[i]))},
                                 {f[i], std::floor(double(spv[i]))},
                                 {c[i], std::ceil(double(spv[i]))}}) {
            if (std::isnan(want)) { CHECK(std::isnan(got)); continue; }
            CHECK_EQ(got, want);
            CHECK_EQ(std::signbit(got), std::signbit(want));
        }
    }
    Vec m = vals(Tensor::from_vector({5.f, -5.f, 5.f, 1.f, INFINITY}) %
                 Tensor::from_vector({INFINITY, INFINITY, -INFINITY, 0.f, 2.f}));
    CHECK_EQ(m[0], 5.0);
    CHECK(std::isinf(m[1]) && m[1] > 0);    // the signs differ: b
    CHECK(std::isinf(m[2]) && m[2] < 0);
    CHECK(std::isnan(m[3]) && std::isnan(m[4]));
    CHECK(Tensor::from_vector({3, -3}).floor().dtype() == DType::INT32);
    CHECK_THROWS(Tensor::from_vector({true}) % Tensor::from_vector({true}), "remainder", "bool");
}

// tg::nn::functional: PyTorch's F., the same values as the methods and layers
// A convolution or pooling by loops in double, over x [N, C, *spatial] with windows of the
// given kernel: for each output element, its window's positions that lie inside x (a position
// in the padding is skipped: 0 for a convolution, -inf for max). visit(out, in_x, position)
// is called for each, out and in_x flat indices.
struct Window {
    Idx kernel, stride, padding, dilation;
    Shape out_of(const Shape& x) const {
        Shape out;
        for (size_t a = 0; a < kernel.size(); a++)
            out.push_back((x[a + 2] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) /
                              stride[a] + 1);
        return out;
    }
    // for each output [n, c, *out] of x's shape and each kernel position: visit
    template <typename F> void each(const Shape& x, int64_t channels_out, F visit) const {
        Shape out = out_of(x), full = {x[0], channels_out};
        full.insert(full.end(), out.begin(), out.end());
        Shape positions(kernel.begin(), kernel.end());
        for (int64_t o = 0; o < count(full); o++) {
            Idx oi = unravel(o, full);
            for (int64_t p = 0; p < count(positions); p++) {
                Idx pi = unravel(p, positions), xi = {oi[0], 0};
                bool inside = true;
                for (size_t a = 0; a < kernel.size(); a++) {
                    int64_t at = oi[a + 2] * stride[a] + pi[a] * dilation[a] - padding[a];
                    inside = inside && at >= 0 && at < x[a + 2];
                    xi.push_back(at);
                }
                visit(o, oi, xi, p, inside);
            }
        }
    }
};
// y = conv(x, w) + b and, for the loss Σ y·r, the gradients of x, w and b
struct ConvRef {
    Vec y, dx, dw, db;
    Shape y_shape;
};
ConvRef ref_conv(const Vec& x, const Shape& xs, const Vec& w, const Shape& ws, const Vec& b,
                 const Vec& r, const Window& win, int64_t groups) {
    ConvRef ref;
    const int64_t c_group = ws[1], o_group = ws[0] / groups;
    ref.y_shape = {xs[0], ws[0]};
    for (int64_t n : win.out_of(xs)) ref.y_shape.push_back(n);
    ref.y.assign(size_t(count(ref.y_shape)), 0);
    ref.dx.assign(x.size(), 0);
    ref.dw.assign(w.size(), 0);
    ref.db.assign(b.size(), 0);
    Shape positions(win.kernel.begin(), win.kernel.end());
    win.each(xs, ws[0], [&](int64_t o, const Idx& oi, Idx xi, int64_t p, bool inside) {
        if (p == 0 && !b.empty()) {
            ref.y[size_t(o)] += b[size_t(oi[1])];
            ref.db[size_t(oi[1])] += r[size_t(o)];
        }
        if (!inside) return;
        for (int64_t c = 0; c < c_group; c++) {
            xi[1] = oi[1] / o_group * c_group + c;
            Idx wi = {oi[1], c};
            for (int64_t k : unravel(p, positions)) wi.push_back(k);
            size_t xf = size_t(ravel(xi, xs)), wf = size_t(ravel(wi, ws));
            ref.y[size_t(o)] += x[xf] * w[wf];
            ref.dx[xf] += r[size_t(o)] * w[wf];
            ref.dw[wf] += r[size_t(o)] * x[xf];
        }
    });
    return ref;
}

TEST(ops_conv_matches_loops_values_and_gradients) {
    namespace F = tg::nn::functional;
    struct Case {
        Shape x, w;
        Idx stride, padding, dilation;
        int64_t groups;
        bool bias;
    };
    const std::vector<Case> cases = {
        {{2, 3, 9}, {4, 3, 3}, {1}, {0}, {1}, 1, true},                      // conv1d
        {{2, 4, 10}, {6, 2, 3}, {2}, {1}, {2}, 2, false},                    // strided, grouped
        {{2, 3, 7, 6}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},       // conv2d, "same"
        {{1, 2, 9, 8}, {4, 2, 3, 2}, {2, 3}, {1, 0}, {2, 1}, 1, true},       // per-axis sizes
        {{2, 6, 5, 5}, {6, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 6, true},       // depthwise
        {{1, 2, 4, 5, 4}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1}, {1, 1, 2}, 1, true},   // 3d
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const Case& c = cases[i];
        const size_t axes = c.x.size() - 2;
        std::vector<float> xv = randf(size_t(count(c.x)), 300 + i),
                           wv = randf(size_t(count(c.w)), 310 + i),
                           bv = c.bias ? randf(size_t(c.w[0]), 320 + i) : std::vector<float>{};
        Window win{Idx(c.w.begin() + 2, c.w.end()), c.stride, c.padding, c.dilation};
        Shape ys = {c.x[0], c.w[0]};
        for (int64_t n : win.out_of(c.x)) ys.push_back(n);
        std::vector<float> rv = randf(size_t(count(ys)), 330 + i);
        ConvRef ref = ref_conv(D(xv), c.x, D(wv), c.w, D(bv), D(rv), win, c.groups);
        Tensor x = Tensor::from_vector(xv, c.x), w = Tensor::from_vector(wv, c.w);
        Tensor b = c.bias ? Tensor::from_vector(bv, {c.w[0]}) : Tensor();
        x.requires_grad();
        w.requires_grad();
        if (c.bias) b.requires_grad();
        auto sizes = [](const Idx& v) {
            tg::nn::SpatialSizes s;
            s.sizes = v;
            return s;
        };
        auto conv = axes == 1 ? F::conv1d : axes == 2 ? F::conv2d : F::conv3d;
        Tensor y = conv(x, w, b, sizes(c.stride), sizes(c.padding), sizes(c.dilation), c.groups,
                        tg::Loc::here());
        (y * Tensor::from_vector(rv, ys)).sum().backward();
        CHECK(y.shape() == ref.y_shape);
        CHECK_ALL_NEAR(vals(y), ref.y, F32);
        CHECK_ALL_NEAR(vals(x.grad()), ref.dx, F32);
        CHECK_ALL_NEAR(vals(w.grad()), ref.dw, F32);
        if (c.bias) CHECK_ALL_NEAR(vals(b.grad()), ref.db, F32);
        if (th::failures()) std::fprintf(stderr, "  in case %zu\n", i);
    }
    // one size for every axis; an input without its batch axis
    std::vector<float> xv = randf(2 * 6 * 6, 341), wv = randf(3 * 2 * 3 * 3, 342);
    Tensor x = Tensor::from_vector(xv, {2, 6, 6}), w = Tensor::from_vector(wv, {3, 2, 3, 3});
    Tensor unbatched = F::conv2d(x, w, Tensor(), 2, 1);
    CHECK(unbatched.shape() == S({3, 3, 3}));
    CHECK_ALL_NEAR(vals(unbatched),
                   vals(F::conv2d(x.unsqueeze(0), w, Tensor(), {2, 2}, {1, 1}).squeeze(0)), 0);
}

TEST(ops_pooling_matches_loops_values_and_gradients) {
    namespace F = tg::nn::functional;
    struct Case {
        Shape x;
        Idx kernel, stride, padding, dilation;
        bool max, count_pad;
    };
    const std::vector<Case> cases = {
        {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, true, true},
        {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true},
        {{1, 2, 9, 7}, {3, 2}, {1, 2}, {1, 0}, {2, 1}, true, true},
        {{2, 3, 10}, {3}, {2}, {1}, {1}, true, true},   // 1d
        {{1, 2, 8, 7}, {2, 2}, {3, 3}, {0, 0}, {1, 1}, true, true},   // apart, rows cut
        {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false, true},
        {{1, 2, 8, 7}, {2, 2}, {3, 3}, {0, 0}, {1, 1}, false, true},
        {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false, true},
        {{1, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false},
        {{2, 3, 10}, {4}, {3}, {2}, {1}, false, false},   // 1d
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const Case& c = cases[i];
        const size_t axes = c.x.size() - 2;
        std::vector<float> xv = randf(size_t(count(c.x)), 350 + i);
        // ties in some windows: the gradient goes to the first of them, as PyTorch's
        for (size_t k = 0; k < xv.size(); k += 5) xv[k] = 0.5f;
        Window win{c.kernel, c.stride, c.padding, c.dilation};
        Shape ys = {c.x[0], c.x[1]};
        for (int64_t n : win.out_of(c.x)) ys.push_back(n);
        std::vector<float> rv = randf(size_t(count(ys)), 360 + i);
        Vec y(size_t(count(ys)), c.max ? -INFINITY : 0), dx(xv.size(), 0), counts(y.size(), 0);
        std::vector<int64_t> best(y.size(), -1);
        win.each(c.x, c.x[1], [&](int64_t o, const Idx& oi, Idx xi, int64_t, bool inside) {
            if (!c.max && c.count_pad) counts[size_t(o)] += 1;
            if (!inside) return;
            xi[1] = oi[1];
            int64_t f = ravel(xi, c.x);
            if (!c.max) {
                counts[size_t(o)] += c.count_pad ? 0 : 1;
                y[size_t(o)] += xv[size_t(f)];
            } else if (xv[size_t(f)] > y[size_t(o)]) {
                y[size_t(o)] = xv[size_t(f)];
                best[size_t(o)] = f;
            }
        });
        for (size_t o = 0; o < y.size(); o++) {
            if (c.max) {
                dx[size_t(best[o])] += rv[o];
                continue;
            }
            y[o] /= counts[o];
        }
        if (!c.max)   // each window's elements get r / count
            win.each(c.x, c.x[1], [&](int64_t o, const Idx& oi, Idx xi, int64_t, bool inside) {
                xi[1] = oi[1];
                if (inside) dx[size_t(ravel(xi, c.x))] += rv[size_t(o)] / counts[size_t(o)];
            });
        Tensor x = Tensor::from_vector(xv, c.x);
        x.requires_grad();
        auto sizes = [](const Idx& v) {
            tg::nn::SpatialSizes s;
            s.sizes = v;
            return s;
        };
        Tensor out;
        if (c.max)
            out = (axes == 1 ? F::max_pool1d : F::max_pool2d)(
                x, sizes(c.kernel), sizes(c.stride), sizes(c.padding), sizes(c.dilation), false,
                tg::Loc::here());
        else
            out = (axes == 1 ? F::avg_pool1d : F::avg_pool2d)(
                x, sizes(c.kernel), sizes(c.stride), sizes(c.padding), c.count_pad, false,
                std::nullopt, tg::Loc::here());
        (out * Tensor::from_vector(rv, ys)).sum().backward();
        CHECK(out.shape() == ys);
        CHECK_ALL_NEAR(vals(out), y, F32);
        CHECK_ALL_NEAR(vals(x.grad()), dx, F32);
        if (th::failures()) std::fprintf(stderr, "  in case %zu\n", i);
    }
    // the stride is the kernel's by default; NaN is the largest
    Tensor x = Tensor::from_vector(std::vector<float>{1, NAN, 3, 4, 5, 6}, {1, 6});
    Vec pooled = vals(F::max_pool1d(x, 2));
    CHECK(pooled.size() == 3 && std::isnan(pooled[0]));
    CHECK_ALL_NEAR((Vec{pooled[1], pooled[2]}), (Vec{4, 6}), 0);
    // a NaN before a window's largest number is picked, and takes the gradient
    Tensor nan_first = Tensor::from_vector(std::vector<float>{NAN, 2, 3, NAN}, {1, 4});
    nan_first.requires_grad();
    Tensor nan_pooled = F::max_pool1d(nan_first, 2);
    nan_pooled.sum().backward();
    Vec firsts = vals(nan_pooled);
    CHECK(firsts.size() == 2 && std::isnan(firsts[0]) && std::isnan(firsts[1]));
    CHECK_ALL_NEAR(vals(nan_first.grad()), (Vec{1, 0, 0, 1}), 0);
    CHECK_ALL_NEAR(vals(F::avg_pool1d(x.slice(1, 2, 6), 2)), (Vec{3.5, 5.5}), 0);
}

// Each case's values and gradient from PyTorch 1.13 (tests/data/make_reference.py)
TEST(ops_pooling_options_match_pytorch) {
    namespace F = tg::nn::functional;
    namespace nn = tg::nn;
    Reference ref = read_reference("tests/data/pooling_reference.txt");
    CHECK_EQ(ref.inputs.size(), size_t(3));
    CHECK_EQ(ref.cases.size(), size_t(15));
    // the input and the pooling of each case
    std::map<std::string, std::pair<std::string, std::function<Tensor(const Tensor&)>>> ours = {
        {"max_pool2d_ceil",
         {"x2", [](const Tensor& x) { return F::max_pool2d(x, 3, 2, 1, 1, true); }}},
        {"max_pool2d_ceil_unpadded",
         {"x2", [](const Tensor& x) { return nn::MaxPool2d(2, 2, 0, 1, true)(x); }}},
        {"avg_pool2d_ceil",
         {"x2", [](const Tensor& x) { return F::avg_pool2d(x, 3, 2, 1, true, true); }}},
        {"avg_pool2d_ceil_pad_uncounted",
         {"x2", [](const Tensor& x) { return F::avg_pool2d(x, 3, 2, 1, false, true); }}},
        {"avg_pool2d_ceil_unpadded",
         {"x2", [](const Tensor& x) { return nn::AvgPool2d(2, 2, 0, true, true)(x); }}},
        {"avg_pool2d_divisor",
         {"x2", [](const Tensor& x) { return F::avg_pool2d(x, 3, 2, 1, true, false, 4); }}},
        {"max_pool1d_ceil",
         {"x1", [](const Tensor& x) { return F::max_pool1d(x, 3, 3, 1, 1, true); }}},
        {"max_pool3d",
         {"x3",
          [](const Tensor& x) {
              return nn::MaxPool3d(2, {2, 1, 2}, {1, 0, 1})(x);
          }}},
        {"avg_pool3d_ceil",
         {"x3", [](const Tensor& x) { return F::avg_pool3d(x, 2, 2, 0, true, true); }}},
        {"adaptive_max_pool1d",
         {"x1", [](const Tensor& x) { return F::adaptive_max_pool1d(x, 4); }}},
        {"adaptive_max_pool2d",
         {"x2",
          [](const Tensor& x) {
              return nn::AdaptiveMaxPool2d({3, 4})(x);
          }}},
        {"adaptive_max_pool3d",
         {"x3",
          [](const Tensor& x) {
              return F::adaptive_max_pool3d(x, {2, 3, 2});
          }}},
        {"adaptive_avg_pool3d",
         {"x3",
          [](const Tensor& x) {
              return nn::AdaptiveAvgPool3d({3, 2, 4})(x);
          }}},
        {"lp_pool2d", {"x2", [](const Tensor& x) { return nn::LPPool2d(2, 2)(x); }}},
        {"lp_pool1d_ceil",
         {"x1", [](const Tensor& x) { return F::lp_pool1d(x.abs() + 0.1, 3, 3, 2, true); }}},
    };
    Cases cases;
    for (const auto& [name, use] : ours)
        cases[name] = {std::vector<const char*>{use.first.c_str()},
                       [f = use.second](CaseInputs x) { return f(x[0]); }};
    check_cases(ref, cases, 1e-12);
    Tensor x = ref.inputs.at("x2");
    CHECK_THROWS(F::avg_pool2d(x, 2, 2, 0, true, false, 0), "avg_pool2d", "divisor_override");
    CHECK_THROWS(F::lp_pool2d(x, 0, 2), "lp_pool2d", "norm_type");
    CHECK_THROWS(F::max_pool3d(ref.inputs.at("x1"), 2), "max_pool3d: input must be", "[2,2,11]");
    CHECK_THROWS(F::adaptive_max_pool2d(x, {2, 0}), "adaptive_max_pool2d", "output_size");
}

// Each case's values and gradient from PyTorch 1.13 (tests/data/make_reference.py); the
// layers and the functions are one
TEST(ops_layout_functions_match_pytorch) {
    namespace F = tg::nn::functional;
    namespace nn = tg::nn;
    Reference ref = read_reference("tests/data/layout_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(8));
    std::map<std::string, std::function<Tensor(const Tensor&)>> ours = {
        {"pixel_shuffle", [](const Tensor& x) { return nn::PixelShuffle(2)(x); }},
        {"pixel_unshuffle", [](const Tensor& x) { return F::pixel_unshuffle(x, 2); }},
        {"channel_shuffle", [](const Tensor& x) { return nn::ChannelShuffle(4)(x); }},
        {"unfold", [](const Tensor& x) { return nn::Unfold({2, 3}, {1, 2}, 1, {2, 1})(x); }},
        {"fold",
         [](const Tensor& x) {
             return nn::Fold(4, {2, 3}, {2, 1}, {1, 0})(x.reshape({2, 24, 8}));
         }},
        {"fold_strided",
         [](const Tensor& x) { return F::fold(x.reshape({2, 48, 4}), {7, 5}, 2, 1, 0, 3); }},
        {"tensor_unfold", [](const Tensor& x) { return x.unfold(3, 3, 2); }},
        {"unflatten", [](const Tensor& x) { return nn::Unflatten(1, {2, -1})(x); }},
    };
    Cases cases;
    for (const auto& [name, f] : ours)
        cases[name] = {std::vector<const char*>{"image"},
                       [f = f](CaseInputs x) { return f(x[0]); }};
    check_cases(ref, cases, 1e-12);
    // movedim is a permutation
    Tensor image = ref.inputs.at("image");
    CHECK_ALL_NEAR(vals(image.movedim(1, -1)), vals(image.permute({0, 2, 3, 1})), 0);
    CHECK_ALL_NEAR(vals(image.movedim(-1, 0)), vals(image.permute({3, 0, 1, 2})), 0);
    CHECK_THROWS(image.movedim(4, 0), "movedim", "[2,8,4,6]");
    // unbatched inputs, and unfold's columns folded back: each element times its windows
    Tensor one = image.slice(0, 0, 1).squeeze(0);
    CHECK_ALL_NEAR(vals(F::unfold(one, 2)), vals(F::unfold(image, 2).slice(0, 0, 1)), 0);
    Tensor ones = Tensor::ones({1, 1, 3, 3}, DType::FLOAT64);
    CHECK_ALL_NEAR(vals(F::fold(F::unfold(ones, 2), 3, 2)), (Vec{1, 2, 1, 2, 4, 2, 1, 2, 1}), 0);
    // the padding layers are functional::pad
    Tensor x = image.slice(0, 0, 1);
    CHECK_ALL_NEAR(vals(nn::ReflectionPad2d({1, 2, 0, 1})(x)),
                   vals(F::pad(x, {1, 2, 0, 1}, "reflect")), 0);
    CHECK_ALL_NEAR(vals(nn::ConstantPad1d(2, 3.5)(x)), vals(F::pad(x, {2, 2}, "constant", 3.5)), 0);
    CHECK_EQ(nn::ZeroPad3d(1)(x).shape(), (Shape{1, 10, 6, 8}));
    CHECK_ALL_NEAR(vals(nn::ReplicationPad1d({0, 2})(x)), vals(F::pad(x, {0, 2}, "replicate")), 0);
    CHECK_ALL_NEAR(vals(nn::CircularPad2d(1)(x)), vals(F::pad(x, {1, 1, 1, 1}, "circular")), 0);
    // errors
    CHECK_THROWS(F::pixel_shuffle(image, 3), "pixel_shuffle", "[2,8,4,6]", "3");
    CHECK_THROWS(F::pixel_unshuffle(image, 4), "pixel_unshuffle", "[2,8,4,6]");
    CHECK_THROWS(F::channel_shuffle(image, 3), "channel_shuffle", "groups 3");
    CHECK_THROWS(F::fold(image.reshape({2, 24, 8}), 5, 2), "fold", "[2,24,8]", "[5,5]");
    CHECK_THROWS(F::unfold(image.reshape({48, 8}), 2), "unfold", "[48,8]");
    CHECK_THROWS(image.unfold(3, 7, 1), "unfold", "size 7", "[2,8,4,6]");
    CHECK_THROWS(image.unfold(3, 2, 0), "unfold", "step 0");
    CHECK_THROWS(image.unflatten(1, {3, -1}), "unflatten", "[3,-1]", "8 long");
    CHECK_THROWS(image.unflatten(1, {-1, -1}), "unflatten", "[-1,-1]");
    CHECK_THROWS(nn::ZeroPad2d({1, 2, 3}), "ZeroPad2d", "[1,2,3]", "4");
}

// Dropout1d/2d/3d zero whole channels: every channel of the result is 0 or x's channel / (1-p)
TEST(ops_channel_dropout_zeroes_whole_channels) {
    namespace F = tg::nn::functional;
    namespace nn = tg::nn;
    Tensor x = Tensor::rand({4, 16, 3, 5}, 7) + 1;   // no zeros of its own
    nn::Dropout2d drop(0.5);
    std::vector<Tensor> results = {drop(x), F::dropout2d(x, 0.5, true, 12),
                                   nn::Dropout1d(0.5)(x.flatten(2, 3)).reshape(x.shape()),
                                   F::dropout3d(x.unsqueeze(2), 0.5, true, 13).squeeze(2)};
    Vec xs = vals(x);
    for (const Tensor& y : results) {
        Vec ys = vals(y);
        int zeroed = 0;
        for (size_t channel = 0; channel < 64; channel++) {
            bool zero = ys[channel * 15] == 0;
            zeroed += zero;
            for (size_t i = channel * 15; i < channel * 15 + 15; i++)
                CHECK_NEAR(ys[i], zero ? 0 : xs[i] * 2, 1e-6);
        }
        CHECK(zeroed > 10 && zeroed < 54);   // about half of the 64 channels
    }
    drop.eval();
    CHECK_ALL_NEAR(vals(drop(x)), xs, 0);
    CHECK_THROWS(nn::Dropout2d(0.5)(x.flatten(0, 2)), "Dropout2d", "[192,5]");
    CHECK_THROWS(F::dropout3d(x.flatten(0, 1), 0.5), "dropout3d", "[64,3,5]");
    CHECK_THROWS(F::dropout2d(x, 1.5), "dropout2d", "1.5");
}

// AlphaDropout keeps a standard normal input's mean 0 and variance 1, sets the dropped ones to
// -λα(1 - p)a and the kept to a·x + λαpa (PyTorch's values); FeatureAlphaDropout does it to
// whole channels; Softmax2d is the softmax over channels
TEST(ops_alpha_dropout_keeps_mean_and_variance) {
    namespace F = tg::nn::functional;
    namespace nn = tg::nn;
    const double p = 0.2, alpha = 1.7580993408473766;
    const double a = 1 / std::sqrt((alpha * alpha * p + 1) * (1 - p)),
                 dropped = -alpha * a * (1 - p);
    Tensor x = Tensor::randn({200, 100}, 3).cast(DType::FLOAT64);
    nn::AlphaDropout drop(p);
    std::vector<Tensor> results = {drop(x), F::alpha_dropout(x, p, true, 5)};
    Vec xs = vals(x);
    for (const Tensor& y : results) {
        Vec ys = vals(y);
        double mean = 0, square = 0, zeroed = 0;
        for (size_t i = 0; i < ys.size(); i++) {
            bool was_dropped = std::fabs(ys[i] - dropped) < 1e-12;
            zeroed += was_dropped;
            if (!was_dropped) CHECK_NEAR(ys[i], a * xs[i] + alpha * a * p, 1e-12);
            mean += ys[i] / double(ys.size()), square += ys[i] * ys[i] / double(ys.size());
        }
        CHECK_NEAR(zeroed / double(ys.size()), p, 0.02);
        CHECK_NEAR(mean, 0, 0.03);
        CHECK_NEAR(square - mean * mean, 1, 0.05);
    }
    CHECK(vals(drop(x)) != vals(drop(x))); // a new mask each call
    drop.eval();
    CHECK_ALL_NEAR(vals(drop(x)), xs, 0);
    CHECK_ALL_NEAR(vals(F::alpha_dropout(x, p)), xs, 0); // training false by default
    CHECK_ALL_NEAR(vals(F::alpha_dropout(x, 1, true)), Vec(xs.size(), 0), 0);

    Tensor images = Tensor::randn({8, 16, 3, 3}, 4);
    for (const Tensor& y :
         {nn::FeatureAlphaDropout(0.5)(images), F::feature_alpha_dropout(images, 0.5, true, 6)}) {
        Vec ys = vals(y);
        int channels_dropped = 0;
        for (size_t channel = 0; channel < 128; channel++) {
            int here = 0;
            for (size_t i = channel * 9; i < channel * 9 + 9; i++)
                here +=
                    std::fabs(ys[i] - (-alpha / std::sqrt((alpha * alpha * 0.5 + 1) * 0.5) * 0.5)) <
                    1e-5;
            CHECK(here == 0 || here == 9);
            channels_dropped += here == 9;
        }
        CHECK(channels_dropped > 40 && channels_dropped < 88); // about half of 128
    }
    Tensor s = nn::Softmax2d()(images);
    CHECK_ALL_NEAR(vals(s), vals(images.softmax(1)), 0);
    CHECK_THROWS(nn::Softmax2d()(images.flatten(1, 3)), "Softmax2d", "[8,144]");
    CHECK_THROWS(nn::AlphaDropout(1.5), "AlphaDropout: p must be in [0, 1], got 1.5");
    CHECK_THROWS(nn::FeatureAlphaDropout(-1), "FeatureAlphaDropout: p must be in [0, 1]");
    CHECK_THROWS(F::feature_alpha_dropout(Tensor::ones({4}), 0.5, true), "feature_alpha_dropout",
                 "[4]");
    CHECK_THROWS(nn::AlphaDropout(0.5)(Tensor::ones({2}, DType::INT32)),
                 "AlphaDropout: input int32 [2] is not a float tensor");
}

// Values and the inputs' gradients from PyTorch 1.13 (tests/data/make_reference.py); one row
// of x2 and one of rows are equal, a distance of 0 (its gradient 0); the bags of ids are
// [1 4 4] [] [0 6 2] [2 5 3]
TEST(ops_bilinear_cdist_embedding_bag_match_pytorch) {
    namespace F = tg::nn::functional;
    Reference ref = read_reference("tests/data/product_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(10));
    Tensor ids = ref.inputs.at("ids").cast(DType::INT64), offsets = ref.inputs.at("offsets");
    offsets = offsets.cast(DType::INT32);
    Tensor ids2 = ref.inputs.at("ids2").cast(DType::INT32);
    Tensor last_offset = Tensor::from_vector(std::vector<int64_t>{0, 3, 3, 6, 9});
    Cases ours = {
        {"bilinear", {{"x1", "x2", "weight", "bias"}, [](const std::vector<Tensor>& x) {
             return F::bilinear(x[0], x[1], x[2], x[3]);
         }}},
        {"cdist", {{"x2", "rows"}, [](const std::vector<Tensor>& x) {
             return tg::cdist(x[0], x[1]);
         }}},
        {"cdist_p1", {{"x2", "rows"}, [](const std::vector<Tensor>& x) {
             return tg::cdist(x[0], x[1], 1);
         }}},
        {"cdist_p3", {{"x2", "rows"}, [](const std::vector<Tensor>& x) {
             return tg::cdist(x[0], x[1], 3);
         }}},
        {"cdist_inf", {{"x2", "rows"}, [](const std::vector<Tensor>& x) {
             return tg::cdist(x[0], x[1], INFINITY);
         }}},
        {"embedding_bag_mean", {{"table"}, [&](const std::vector<Tensor>& x) {
             return F::embedding_bag(ids, x[0], offsets);
         }}},
        {"embedding_bag_sum_weighted", {{"table", "sample_weights"},
                                        [&](const std::vector<Tensor>& x) {
             return F::embedding_bag(ids, x[0], offsets, "sum", x[1]);
         }}},
        {"embedding_bag_max", {{"table"}, [&](const std::vector<Tensor>& x) {
             return F::embedding_bag(ids, x[0], offsets, "max");
         }}},
        {"embedding_bag_last_offset_padding", {{"table"}, [&](const std::vector<Tensor>& x) {
             return F::embedding_bag(ids, x[0], last_offset, "mean", Tensor(), true, 2);
         }}},
        {"embedding_bag_2d_max_padding", {{"table"}, [&](const std::vector<Tensor>& x) {
             return F::embedding_bag(ids2, x[0], Tensor(), "max", Tensor(), false, 5);
         }}},
    };
    check_cases(ref, ours, 1e-12);
    // the layers of two inputs
    Tensor a = ref.inputs.at("x2"), b = ref.inputs.at("rows").slice(1, 0, 3);
    CHECK_ALL_NEAR(vals(tg::nn::PairwiseDistance(1)(a, b)), vals(F::pairwise_distance(a, b, 1)), 0);
    CHECK_ALL_NEAR(vals(tg::nn::CosineSimilarity(2)(a, b)), vals(F::cosine_similarity(a, b, 2)), 0);
    tg::nn::Bilinear layer(4, 5, 6);
    CHECK(layer.weight.shape() == Shape({6, 4, 5}) && layer.named_parameters().size() == 2);
    CHECK(vals(layer.weight.abs().max())[0] <= 0.5);   // U(-1/√4, 1/√4)
    CHECK(layer(ref.inputs.at("x1").cast(DType::FLOAT32), a.cast(DType::FLOAT32)).shape() ==
          Shape({2, 3, 6}));
    // errors
    CHECK_THROWS(tg::cdist(a, ref.inputs.at("x1")), "cdist", "[2,3,5]", "[2,3,4]");
    CHECK_THROWS(tg::cdist(a, a, -1), "cdist", "p");
    CHECK_THROWS(F::bilinear(ref.inputs.at("x1"), a, ref.inputs.at("weight").transpose(1, 2)),
                 "bilinear", "[6,5,4]");
    CHECK_THROWS(layer(a), "Bilinear", "two inputs");
    CHECK_THROWS(tg::nn::PairwiseDistance()(a), "PairwiseDistance", "two inputs");
    CHECK_THROWS(tg::nn::Bilinear(0, 5, 6), "Bilinear", "in1 0");
    // the layer: its padding row starts at 0; 2-D ids alone, 1-D with offsets
    tg::nn::EmbeddingBag bag(7, 3, "sum", false, 2);
    CHECK_ALL_NEAR(vals(bag.weight.slice(0, 2, 3)), (Vec{0, 0, 0}), 0);
    bag.weight = ref.inputs.at("table").cast(DType::FLOAT32).requires_grad();
    CHECK_ALL_NEAR(vals(bag(ids2)), vals(F::embedding_bag(ids2, bag.weight, Tensor(), "sum",
                                                         Tensor(), false, 2)), 0);
    CHECK_EQ(bag(ids, offsets).shape(), (Shape{4, 3}));
    Tensor table = ref.inputs.at("table");
    CHECK_THROWS(F::embedding_bag(ids, table), "embedding_bag", "[9]", "offsets");
    CHECK_THROWS(F::embedding_bag(ids2, table, offsets), "embedding_bag", "[2,4]");
    CHECK_THROWS(F::embedding_bag(ids, table, offsets, "median"), "embedding_bag", "median");
    CHECK_THROWS(F::embedding_bag(ids, table, offsets, "max", ref.inputs.at("sample_weights")),
                 "embedding_bag", "per_sample_weights", "\"max\"");
    CHECK_THROWS(tg::nn::EmbeddingBag(7, 3, "median"), "EmbeddingBag", "median");
}

// Values and gradients from PyTorch 1.13 (tests/data/make_reference.py); logaddexp's a and b
// tie twice (each gets half); searchsorted and bucketize against PyTorch's indices
TEST(ops_diagonal_kron_diff_logaddexp_search_match_pytorch) {
    Reference ref = read_reference("tests/data/math_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(9));
    Cases ours = {
        {"diagonal",
         {{"m"}, [](const std::vector<Tensor>& x) { return tg::diagonal(x[0], 1, 1, 2); }}},
        {"diagonal_below",
         {{"m"}, [](const std::vector<Tensor>& x) { return tg::diagonal(x[0], -1, 2, 0); }}},
        {"trace",
         {{"m"},
          [](const std::vector<Tensor>& x) { return tg::trace(x[0].slice(0, 1, 2).squeeze(0)); }}},
        {"diag_vector", {{"v"}, [](const std::vector<Tensor>& x) { return tg::diag(x[0], -1); }}},
        {"diag_matrix",
         {{"m"},
          [](const std::vector<Tensor>& x) {
              return tg::diag(x[0].slice(0, 0, 1).squeeze(0), 2);
          }}},
        {"outer", {{"v", "w"}, [](const std::vector<Tensor>& x) { return tg::outer(x[0], x[1]); }}},
        {"kron",
         {{"a", "v"},
          [](const std::vector<Tensor>& x) {
              return tg::kron(x[0], x[1].reshape({3, 1}));
          }}},
        {"diff", {{"m"}, [](const std::vector<Tensor>& x) { return tg::diff(x[0], 2, 1); }}},
        {"logaddexp",
         {{"a", "b"}, [](const std::vector<Tensor>& x) { return tg::logaddexp(x[0], x[1]); }}},
    };
    check_cases(ref, ours, 1e-12);
    Tensor sorted = Tensor::from_vector(Vec{1, 3, 5, 7, 2, 4, 6, 8}, {2, 4});
    Tensor values = Tensor::from_vector(Vec{3, 6, 9, 3, 6, 9}, {2, 3});
    CHECK(ivals(tg::searchsorted(sorted, values)) == (std::vector<int>{1, 3, 4, 1, 2, 4}));
    CHECK(ivals(tg::searchsorted(sorted, values, true)) == (std::vector<int>{2, 3, 4, 1, 3, 4}));
    Tensor edges = Tensor::from_vector(Vec{1, 3, 5, 7});
    Tensor points = Tensor::from_vector(Vec{0, 3, 8, 5, 5, 2}, {2, 3});
    CHECK(ivals(tg::searchsorted(edges, points)) == (std::vector<int>{0, 1, 4, 2, 2, 1}));
    CHECK(ivals(tg::bucketize(points, edges)) == (std::vector<int>{0, 1, 4, 2, 2, 1}));
    CHECK(ivals(tg::bucketize(points, edges, true)) == (std::vector<int>{0, 2, 4, 3, 3, 1}));
    CHECK(tg::bucketize(points, edges).dtype() == DType::INT64);
    Tensor flags = Tensor::from_vector(std::vector<bool>{true, false, false, true});
    CHECK(ivals(tg::diff(flags).cast(DType::INT32)) == (std::vector<int>{1, 0, 1}));
    Tensor inf = Tensor::from_vector(Vec{INFINITY, -INFINITY});
    CHECK_ALL_NEAR(vals(tg::logaddexp(inf, inf)), (Vec{INFINITY, -INFINITY}), 0);
    // errors
    Tensor m = ref.inputs.at("m");
    CHECK_THROWS(tg::diagonal(m, 0, 1, 1), "diagonal", "axis1 and axis2");
    CHECK_THROWS(tg::trace(m), "trace", "[2,3,4]");
    CHECK_THROWS(tg::diag(m), "diag", "[2,3,4]");
    CHECK_THROWS(tg::outer(m, m), "outer", "vectors");
    CHECK_THROWS(tg::diff(m, -1), "diff", "n");
    CHECK_THROWS(tg::searchsorted(sorted, points.slice(0, 0, 1)), "searchsorted", "[2,4]", "[1,3]");
    CHECK_THROWS(tg::bucketize(points, sorted), "bucketize", "[2,4]");
}

// Values and gradients from PyTorch 1.13 (tests/data/make_reference.py): scatter along axis 1
// of base [3, 5] from src [4, 6] at index [2, 4], with repeated places, ties with base for
// amax and amin (shared alike), and a zero for prod; src is passed whole (PyTorch's cut to
// index's shape)
TEST(ops_scatter_and_scatter_reduce_match_pytorch) {
    Reference ref = read_reference("tests/data/scatter_reference.txt");
    CHECK_EQ(ref.cases.size(), size_t(23));
    using X = const std::vector<Tensor>&;
    auto index = [](std::vector<int64_t> v) { return Tensor::from_vector(v, {2, 4}); };
    Tensor repeated = index({0, 1, 0, 3, 4, 4, 2, 4}), unique = index({0, 1, 4, 3, 4, 1, 2, 0});
    Tensor slice_index = Tensor::from_vector(std::vector<int64_t>{3, 0});
    Cases ours = {
        {"scatter", {{"base", "src"}, [&](X x) { return x[0].scatter(1, unique, x[1]); }}},
        {"scatter_repeated",
         {{}, [&](X) { return ref.inputs.at("base").scatter(1, repeated, ref.inputs.at("src")); }}},
        {"scatter_value", {{"base"}, [&](X x) { return x[0].scatter(1, repeated, -4.5); }}},
        {"index_copy",
         {{"base", "slices"}, [&](X x) { return x[0].index_copy(1, slice_index, x[1]); }}},
        {"index_fill", {{"base"}, [&](X x) { return x[0].index_fill(1, slice_index, 2.5); }}},
        {"index_reduce_amax",
         {{"base", "slices"},
          [&](X x) {
              Tensor threes = Tensor::from_vector(std::vector<int64_t>{3, 3});
              return x[0].index_reduce(1, threes, x[1], "amax");
          }}},
        {"scatter_reduce_mean_int",
         {{},
          [](X) {
              Tensor self = Tensor::from_vector(std::vector<int64_t>{10, 20, 30, 40}, {1, 4});
              Tensor at = Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 1, 1}, {1, 5});
              Tensor src = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, -8}, {1, 5});
              return self.scatter_reduce(1, at, src, "mean", false);
          }}},
    };
    namespace F = tg::nn::functional;
    const Tensor& image = ref.inputs.at("image");
    ours["max_pool2d_indices"] = {
        {}, [&](X) { return F::max_pool2d_with_indices(image, 3, 2, 1).indices; }};
    ours["max_pool2d_indices_ceil"] = {
        {}, [&](X) { return F::max_pool2d_with_indices(image, 2, {2, 3}, 0, 1, true).indices; }};
    ours["max_pool1d_indices_dilated"] = {{}, [&](X) {
        return F::max_pool1d_with_indices(image.reshape({2, 2, 42}), 3, 2, 1, 2).indices;
    }};
    ours["max_pool3d_indices"] = {{}, [&](X) {
        return F::max_pool3d_with_indices(image.reshape({1, 2, 7, 6, 2}), 2, {2, 2, 1}, {1, 0, 0})
            .indices;
    }};
    ours["max_unpool2d"] = {{"pooled"}, [&](X x) {
        return F::max_unpool2d(x[0], F::max_pool2d_with_indices(image, 2, 2).indices, 2, 2, 0,
                               {7, 6});
    }};
    ours["max_unpool2d_padded"] = {{"pooled_wide"}, [&](X x) {
        tg::nn::MaxUnpool2d unpool(2, 2, 1);   // the layer
        return unpool(x[0], F::max_pool2d_with_indices(image, 2, 2, 1).indices, {2, 2, 7, 6});
    }};
    for (const char* reduce : {"sum", "mean", "amax", "amin", "prod"})
        for (bool include_self : {true, false})
            ours[std::string("scatter_reduce_") + reduce + (include_self ? "_self" : "_src")] = {
                {"base", "src"}, [&, reduce, include_self](X x) {
                    Tensor self = include_self ? x[0] : x[0] + 0.5;   // as the script's
                    return self.scatter_reduce(1, repeated, x[1], reduce, include_self);
                }};
    check_cases(ref, ours, 1e-12);
    // integers and bool, NaN, and an index past the end found when the program runs
    Tensor ints = Tensor::from_vector(std::vector<int>{5, 1, 7}), at = Tensor::from_vector(
        std::vector<int64_t>{2, 0, 2});
    Tensor more = Tensor::from_vector(std::vector<int>{4, -3, 9});
    CHECK(ivals(ints.scatter_reduce(0, at, more, "amax")) == (std::vector<int>{5, 1, 9}));
    CHECK(ivals(ints.scatter_reduce(0, at, more, "amin", false)) == (std::vector<int>{-3, 1, 4}));
    CHECK(ivals(ints.scatter_reduce(0, at, more, "prod")) == (std::vector<int>{-15, 1, 252}));
    CHECK(ivals(ints.scatter(0, at, more)) == (std::vector<int>{-3, 1, 9}));
    Tensor flags = Tensor::from_vector(std::vector<bool>{false, false, true});
    Tensor set = flags.scatter(0, at.slice(0, 1, 2), Tensor::from_vector(std::vector<bool>{true}));
    CHECK(set.dtype() == DType::BOOL && ivals(set.cast(DType::INT32)) == (std::vector<int>{1, 0, 1}));
    Tensor with_nan = Tensor::from_vector(Vec{1, NAN, 3});
    CHECK_ALL_NEAR(vals(Tensor::zeros({3}, DType::FLOAT64).scatter_reduce(0, at, with_nan, "amax")),
                   (Vec{NAN, 0, 3}), 0);
    Tensor base = ref.inputs.at("base");
    for (const char* reduce : {"sum", "mean", "amax", "amin", "prod"})
        for (bool include_self : {true, false})
            CHECK_THROWS(base.scatter_reduce(1, repeated + 1, ref.inputs.at("src"), reduce,
                                             include_self).realize(),
                         "scatter_reduce: index out of range [0, 5)");
    // errors
    CHECK_THROWS(base.scatter_reduce(1, repeated, ref.inputs.at("src"), "max"), "scatter_reduce",
                 "\"max\"", "sum, mean, amax, amin or prod");
    CHECK_THROWS(base.scatter(1, repeated, ints), "scatter", "one dtype", "int32 [3]");
    CHECK_THROWS(base.scatter(0, repeated, base.slice(1, 0, 3)), "scatter", "no longer than src",
                 "[2,4]", "[3,3]");
    CHECK_THROWS(base.scatter(1, repeated.reshape({8}), 1.0), "scatter", "self's rank", "[8]");
    CHECK_THROWS(flags.scatter_reduce(0, at, flags, "sum"), "scatter_reduce", "not bool");
    CHECK_THROWS(base.index_copy(1, slice_index, base), "index_copy", "[3,2]", "[3,5]");
    CHECK_THROWS(base.index_fill(1, repeated, 1.0), "index_fill", "1-D", "[2,4]");
    auto [pooled, where_from] = F::max_pool2d_with_indices(image, 2);
    CHECK(where_from.dtype() == DType::INT64 && pooled.shape() == (tg::Shape{2, 2, 3, 3}));
    CHECK_THROWS(F::max_unpool2d(pooled, where_from.slice(0, 0, 1), 2), "max_unpool2d",
                 "of x's shape [2,2,3,3]", "[1,2,3,3]");
    CHECK_THROWS(F::max_unpool2d(pooled, where_from, 2, 2, 0, {9, 6}), "max_unpool2d",
                 "output_size 9", "6 ± the stride 2");
    CHECK_THROWS(F::max_unpool2d(pooled, where_from, 2, 2, 0, {7, 6, 1}), "max_unpool2d",
                 "must have 2 (or 4) sizes");
    CHECK_THROWS(F::max_unpool2d(pooled, where_from + 6, 2).realize(),
                 "max_unpool2d: index out of range [0, 36)");
    tg::nn::MaxUnpool1d unpool(2);
    CHECK_THROWS(unpool(pooled), "max_unpool1d", "it takes the indices too");
}

TEST(ops_conv_and_pooling_errors_name_the_shapes) {
    namespace F = tg::nn::functional;
    Tensor x = Tensor::zeros({2, 3, 8, 8}), w = Tensor::zeros({4, 3, 3, 3});
    CHECK_THROWS(F::conv2d(x, Tensor::zeros({4, 2, 3, 3})), "conv2d", "[2,3,8,8]", "[4,2,3,3]",
                 "groups 1", "test_ops.cpp:");
    CHECK_THROWS(F::conv2d(x, w, Tensor(), 1, 0, 1, 2), "conv2d", "groups 2");
    CHECK_THROWS(F::conv2d(x, w, Tensor::zeros({3})), "conv2d: bias must be [C_out] = [4]", "[3]");
    CHECK_THROWS(F::conv2d(x, Tensor::zeros({4, 3, 3})), "conv2d: weight must be", "[4,3,3]");
    CHECK_THROWS(F::conv1d(x, w), "conv1d: input must be", "[2,3,8,8]");
    CHECK_THROWS(F::conv2d(x, Tensor::zeros({4, 3, 9, 3})), "conv2d", "smaller than the kernel",
                 "[9,3]");
    CHECK_THROWS(F::conv2d(x, Tensor::zeros({4, 3, 0, 3})), "conv2d: the kernel is empty");
    CHECK_THROWS(F::conv2d(x, w, Tensor(), 0), "conv2d: stride must be 2 sizes", "[0]");
    CHECK_THROWS(F::conv2d(x, w, Tensor(), {1, 1, 1}), "conv2d: stride", "[1,1,1]");
    CHECK_THROWS(F::conv2d(x, w, Tensor(), 1, -1), "conv2d: padding", "at least 0");
    CHECK_THROWS(F::max_pool2d(x, 2, 2, 2), "max_pool2d: padding [2,2]",
                 "at most half the kernel [2,2]");
    CHECK_THROWS(F::avg_pool2d(x.cast(DType::INT32), 2), "avg_pool2d", "floating point",
                 "int32");
    CHECK_THROWS(F::max_pool2d(Tensor::zeros({8}), 2), "max_pool2d: input must be", "[8]");
    CHECK_THROWS(tg::nn::Conv2d(3, 4, 3, 1, 0, 1, 2), "Conv2d", "groups 2");
    CHECK_THROWS(tg::nn::Conv2d(3, 4, {3, 3, 3}), "Conv2d: kernel_size must be 2 sizes");
}

TEST(ops_functional_and_dropout) {
    namespace F = tg::nn::functional;
    std::vector<float> xv = randf(24, 161, -2, 2);
    Tensor x = Tensor::from_vector(xv, {4, 6});
    CHECK_ALL_NEAR(vals(F::relu(x)), vals(x.relu()), 0);
    CHECK_ALL_NEAR(vals(F::gelu(x, true)), vals(x.gelu(true)), 0);
    CHECK_ALL_NEAR(vals(F::softmax(x, 0)), vals(x.softmax(0)), 0);
    CHECK_ALL_NEAR(vals(F::log_softmax(x)), vals(x.log_softmax(-1)), 0);
    CHECK_ALL_NEAR(vals(F::sigmoid(x) + F::tanh(x)), vals(x.sigmoid() + x.tanh()), 0);
    tg::nn::Linear lin(6, 3);
    CHECK_ALL_NEAR(vals(F::linear(x, lin.weight, lin.bias)), vals(lin(x)), F32);
    CHECK_ALL_NEAR(vals(F::matmul(x, lin.weight.t())), vals(x.matmul(lin.weight.t())), 0);
    tg::nn::LayerNorm ln(6);
    CHECK_ALL_NEAR(vals(F::layer_norm(x, ln.weight, ln.bias)), vals(ln(x)), F32);
    Tensor ids = Tensor::from_vector(std::vector<int64_t>{2, 0, 3}), emb = Tensor::randn({4, 5});
    CHECK_ALL_NEAR(vals(F::embedding(ids, emb)), vals(emb[ids]), 0);
    tg::nn::Embedding layer(4, 5);   // int64 and int32 ids pick the same rows
    CHECK_ALL_NEAR(vals(layer(ids)), vals(layer(Tensor::from_vector({2, 0, 3}))), 0);
    CHECK_ALL_NEAR(vals(layer(ids).sum(1)), vals(layer.weight.sum(1).gather(0, ids)), F32);
    Tensor oh = F::one_hot(Tensor::from_vector({0, 2, 1}));
    CHECK(oh.dtype() == DType::INT64 && oh.shape() == S({3, 3}));
    CHECK(oh.to_vector<int64_t>() == (std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 1, 0}));
    CHECK(F::one_hot(Tensor::from_vector({1}), 4).shape() == S({1, 4}));
    CHECK_THROWS(F::one_hot(x), "one_hot", "float32");
    Tensor ce = tg::nn::cross_entropy(x, Tensor::from_vector({0, 5, 2, 1}));
    CHECK_EQ(F::cross_entropy(x, Tensor::from_vector({0, 5, 2, 1})).item(), ce.item());

    // attention against loops in double: softmax(q kᵀ/√d) v, causal or not
    std::vector<float> qv = randf(2 * 5 * 4, 171), kv = randf(2 * 6 * 4, 172), vv = randf(2 * 6 * 3, 173);
    Tensor q = Tensor::from_vector(qv, {2, 5, 4}), k = Tensor::from_vector(kv, {2, 6, 4});
    Tensor v = Tensor::from_vector(vv, {2, 6, 3});
    // softmax over the keys j of score(b, i, j, q_i·k_j), times v
    auto attention_loops = [&](const std::function<double(int, int, int, double)>& score) {
        Vec want;
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < 5; i++) {
                Vec w(6);
                double top = -INFINITY, total = 0;
                for (int j = 0; j < 6; j++) {
                    double dot = 0;
                    for (int c = 0; c < 4; c++) dot += double(qv[size_t((b * 5 + i) * 4 + c)]) *
                                                       kv[size_t((b * 6 + j) * 4 + c)];
                    w[size_t(j)] = score(b, i, j, dot);
                    top = std::max(top, w[size_t(j)]);
                }
                for (double& e : w) total += e = std::exp(e - top);
                for (int c = 0; c < 3; c++) {
                    double y = 0;
                    for (int j = 0; j < 6; j++) y += w[size_t(j)] / total * vv[size_t((b * 6 + j) * 3 + c)];
                    want.push_back(y);
                }
            }
        return want;
    };
    for (bool causal : {false, true}) {
        Vec want = attention_loops([&](int, int i, int j, double dot) {
            return causal && j > i ? -INFINITY : dot / 2;
        });
        CHECK_ALL_NEAR(vals(F::scaled_dot_product_attention(q, k, v, causal)), want, F32);
    }
    CHECK_THROWS(F::scaled_dot_product_attention(q, v, v), "attention", "[2,5,4]", "[2,6,3]");
    // PyTorch's other arguments: a bool mask (broadcast over the batch), an additive one of
    // q's dtype, a scale of our own
    std::vector<float> addv = randf(2 * 5 * 6, 174);
    std::vector<int32_t> keepv = randi(5 * 6, 175, 0, 3);
    for (size_t i = 0; i < keepv.size(); i += 6) keepv[i] = 1;   // each query sees a key
    Tensor keep = Tensor::from_vector(keepv, {5, 6}) != 0;
    Tensor added = Tensor::from_vector(addv, {2, 5, 6});
    for (int bool_mask = 0; bool_mask < 2; bool_mask++) {
        Vec want = attention_loops([&](int b, int i, int j, double dot) {
            return bool_mask ? (keepv[size_t(i * 6 + j)] ? dot * 0.3 : -INFINITY)
                             : dot * 0.3 + addv[size_t((b * 5 + i) * 6 + j)];
        });
        Tensor out = F::scaled_dot_product_attention(q, k, v, bool_mask ? keep : added, 0, false,
                                                     0.3);
        CHECK_ALL_NEAR(vals(out), want, F32);
    }
    // dropout of the weights: each kept weight doubled at p = 0.5, so rows of ones average 1
    Tensor many = Tensor::randn({64, 8, 4}, 176), unit = Tensor::ones({64, 8, 1});
    Vec dropped = vals(F::scaled_dot_product_attention(many, many, unit, Tensor(), 0.5));
    double mean = 0;
    bool some_changed = false;
    for (double y : dropped) {
        mean += y / double(dropped.size());
        some_changed = some_changed || std::fabs(y - 1) > 1e-3;
    }
    CHECK(some_changed);
    CHECK(std::fabs(mean - 1) < 0.1);
    std::string here = std::to_string(__LINE__ + 1);
    CHECK_THROWS(F::scaled_dot_product_attention(q, k, v, keep, 0, true), "attn_mask",
                 "is_causal", here.c_str());
    CHECK_THROWS(F::scaled_dot_product_attention(q, k, v, Tensor::zeros({5, 5})), "attn_mask",
                 "[5,5]", "[2,5,6]");
    CHECK_THROWS(F::scaled_dot_product_attention(q, k, v, Tensor::zeros({5, 6}, DType::INT32)),
                 "attn_mask", "int32");
    CHECK_THROWS(F::scaled_dot_product_attention(q, k, v, Tensor(), 1.5), "dropout", "1.5");

    // warm-up then cosine, against the formula; clip_grad_norm_ scales to the norm asked
    tg::optim::Schedule lr = tg::optim::warmup_cosine(0.1, 4, 12, 0.01);
    for (int t = 1; t <= 14; t++) {
        double want = t <= 4 ? 0.1 * t / 4
                             : 0.01 + 0.09 * (1 + std::cos(M_PI * std::min(1.0, (t - 4) / 8.0))) / 2;
        CHECK_NEAR(lr(Tensor::full({}, double(t))).item(), want, 1e-6);
    }
    CHECK_THROWS(tg::optim::warmup_cosine(0.1, 5, 5), "warmup_cosine", "warmup 5", "total 5");
    Tensor p1 = Tensor::from_vector({3.f, 0.f}).requires_grad();
    Tensor p2 = Tensor::from_vector({4.f}).requires_grad();
    ((p1 * p1).sum() / 2.0 + (p2 * p2).sum() / 2.0).backward();   // gradients 3, 0 and 4: norm 5
    CHECK_NEAR(tg::nn::clip_grad_norm_({p1, p2}, 1.0).item(), 5.0, 1e-6);
    CHECK_ALL_NEAR(vals(p1.grad()), (Vec{0.6, 0}), 1e-6);
    CHECK_ALL_NEAR(vals(p2.grad()), (Vec{0.8}), 1e-6);
    CHECK_NEAR(tg::nn::clip_grad_norm_({p1, p2}, 10.0).item(), 1.0, 1e-6);   // under: unchanged
    CHECK_ALL_NEAR(vals(p2.grad()), (Vec{0.8}), 1e-6);

    // dropout: about p zeroed, the rest scaled by 1/(1-p); a new mask every call, in a jit too
    tg::manual_seed(7);
    tg::nn::Dropout drop(0.25);
    Tensor ones = Tensor::ones({64, 64});
    auto check_mask = [&](const Tensor& y) {
        Vec v = vals(y);
        int64_t zeros = 0;
        for (double e : v) {
            CHECK(e == 0 || std::fabs(e - 1 / 0.75) < 1e-6);
            zeros += e == 0;
        }
        CHECK(std::abs(double(zeros) / double(v.size()) - 0.25) < 0.03);   // 4096 draws
        return v;
    };
    Vec first = check_mask(drop(ones)), second = check_mask(drop(ones));
    CHECK(first != second);
    tg::Jit step([&](const std::vector<Tensor>& in) { return drop(in[0]); });
    Vec j1 = check_mask(step({ones})), j2 = check_mask(step({ones})), j3 = check_mask(step({ones}));
    CHECK(step.replays() == 2 && j1 != j2 && j2 != j3 && j1 != j3);
    drop.eval();
    CHECK_ALL_NEAR(vals(drop(x)), D(xv), 0);
    tg::nn::Sequential seq(tg::nn::Linear(6, 6), tg::nn::Dropout(0.5));
    seq.eval();
    CHECK(!seq.layers[1]->training);
    CHECK_ALL_NEAR(vals(seq(x)), vals(seq.layers[0]->forward(x)), 0);
    CHECK_ALL_NEAR(vals(F::dropout(x, 0.5, false)), D(xv), 0);
    CHECK_ALL_NEAR(vals(F::dropout(x, 0.4, true, 3)), vals(F::dropout(x, 0.4, true, 3)), 0);
    CHECK_ALL_NEAR(vals(F::dropout(x, 1.0)), Vec(24, 0.0), 0);
    CHECK_THROWS(tg::nn::Dropout(1.5), "Dropout", "p must be in [0, 1]", "1.5");
    // train() and eval() reach every layer inside a composite
    tg::nn::TransformerBlock block(8, 2, 0.1);
    block.eval();
    CHECK(!block.training && !block.attn.attn_drop.training && !block.drop.training);
    Tensor tokens = Tensor::randn({1, 3, 8});
    CHECK_ALL_NEAR(vals(block(tokens)), vals(block(tokens)), 0);   // no dropout in eval
    block.train();
    CHECK(block.attn.attn_drop.training && block.mlp.layers[0]->training);
    CHECK_THROWS(tg::nn::CausalSelfAttention(10, 3), "CausalSelfAttention", "10", "heads 3");
    CHECK_THROWS(block(Tensor::zeros({3, 8})), "CausalSelfAttention", "[3,8]", "[batch, time, 8]");
    tg::nn::ModuleList list;
    list.append(tg::nn::ReLU());
    CHECK_THROWS(list.at<tg::nn::Tanh>(0), "ModuleList", "layer 0", "type");
    CHECK_THROWS(list.at(1), "ModuleList", "layer 1 of 1");
    CHECK_THROWS(list(x), "ModuleList", "no forward");
    CHECK_THROWS(tg::nn::Dropout(0.5)(Tensor::ones({2}, DType::INT32)), "Dropout", "int32");
}

// activations, logsumexp, any/all, triangles and logical ops against loops in double, with
// PyTorch's edge values (-0, NaN, ±∞, the thresholds)
// functional's activations beyond the Tensor's, against loops in double at their kinks, ±∞
// and NaN; their gradients at the kinks as PyTorch 1.13 gave them; the layers; the errors
TEST(ops_more_activations_match_loops) {
    namespace F = tg::nn::functional;
    namespace nn = tg::nn;
    Vec xv = {-30, -3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 6, 30, NAN, INFINITY, -INFINITY};
    Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()));
    const double selu_a = 1.6732632423543772, selu_s = 1.0507009873554805;
    struct Case {
        const char* name;
        Tensor got;
        std::function<double(double)> want;
    };
    std::vector<Case> cases = {
        {"hardtanh", F::hardtanh(x, -1, 2), [](double v) { return v <= -1 ? -1 : v >= 2 ? 2 : v; }},
        {"relu6", F::relu6(x), [](double v) { return v <= 0 ? 0 : v >= 6 ? 6 : v; }},
        {"hardsigmoid", F::hardsigmoid(x),
         [](double v) { return v <= -3 ? 0 : v >= 3 ? 1 : v / 6 + 0.5; }},
        {"hardswish", F::hardswish(x),
         [](double v) { return v < -3 ? 0 : v <= 3 ? v * (v + 3) / 6 : v; }},
        {"mish", F::mish(x),
         [](double v) { return v * std::tanh(v > 20 ? v : std::log1p(std::exp(v))); }},
        {"selu", F::selu(x),
         [&](double v) { return v > 0 ? selu_s * v : selu_s * selu_a * std::expm1(v); }},
        {"celu", F::celu(x, 1.5), [](double v) { return v > 0 ? v : 1.5 * std::expm1(v / 1.5); }},
        {"softsign", F::softsign(x), [](double v) { return v / (1 + std::fabs(v)); }},
        {"logsigmoid", F::logsigmoid(x),
         [](double v) { return std::min(v, 0.0) - std::log1p(std::exp(-std::fabs(v))); }},
        {"tanhshrink", F::tanhshrink(x), [](double v) { return v - std::tanh(v); }},
        {"hardshrink", F::hardshrink(x), [](double v) { return v >= -0.5 && v <= 0.5 ? 0 : v; }},
        {"softshrink", F::softshrink(x),
         [](double v) { return v > 0.5 ? v - 0.5 : v < -0.5 ? v + 0.5 : 0; }},
        {"threshold", F::threshold(x, 1, -7), [](double v) { return v <= 1 ? -7 : v; }},
        {"prelu", F::prelu(x, Tensor::full({1}, 0.25)),
         [](double v) { return v > 0 ? v : 0.25 * v; }},
    };
    for (Case& c : cases) {
        Vec got = vals(c.got);
        Vec want = ref_unary(xv, c.want);
        for (size_t i = 0; i < xv.size(); i++) {
            bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                            : std::fabs(got[i] - want[i]) <=
                                                  F32 * (1 + std::fabs(want[i])) || got[i] == want[i];
            if (!same)
                th::report(__FILE__, __LINE__, std::string(c.name) + " at " + th::show(xv[i]) +
                                                   ": " + th::show(got[i]) + " vs " +
                                                   th::show(want[i]));
        }
    }
    // gradients at the kinks (and beside them), as PyTorch's
    Vec kinks = {-3, 3, -1, 2, 0, 6, -0.5, 0.5, 1};
    auto grad_of = [&](std::function<Tensor(const Tensor&)> f) {
        Tensor k = Tensor::from_vector(std::vector<float>(kinks.begin(), kinks.end())).requires_grad();
        f(k).sum().backward();
        return vals(k.grad());
    };
    const double s6 = 1.0 / 6;
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::hardtanh(t, -1, 2); }),
                   (Vec{0, 0, 0, 0, 1, 0, 1, 1, 1}), 0);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::relu6(t); }),
                   (Vec{0, 1, 0, 1, 0, 0, 0, 1, 1}), 0);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::hardsigmoid(t); }),
                   (Vec{0, 0, s6, s6, s6, 0, s6, s6, s6}), 1e-7);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::hardswish(t); }),
                   (Vec{-0.5, 1.5, 1.0 / 6, 7.0 / 6, 0.5, 1, 1.0 / 3, 2.0 / 3, 5.0 / 6}), 1e-6);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::hardshrink(t); }),
                   (Vec{1, 1, 1, 1, 0, 1, 0, 0, 1}), 0);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::softshrink(t); }),
                   (Vec{1, 1, 1, 1, 0, 1, 0, 0, 1}), 0);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::threshold(t, 1, -7); }),
                   (Vec{0, 1, 0, 1, 0, 1, 0, 0, 0}), 0);
    CHECK_ALL_NEAR(grad_of([](const Tensor& t) { return F::prelu(t, Tensor::full({1}, 0.25)); }),
                   (Vec{0.25, 1, 0.25, 1, 0.25, 1, 0.25, 1, 1}), 0);
    // the layers; PReLU's weight per channel along axis 1, learned
    CHECK_ALL_NEAR(vals(nn::Hardtanh(-1, 2)(x) + nn::ReLU6()(x) + nn::Hardsigmoid()(x) +
                        nn::Hardswish()(x) + nn::Softshrink(0.25)(x) + nn::Hardshrink(0.25)(x) +
                        nn::Threshold(1, -7)(x) + nn::CELU(1.5)(x)),
                   vals(F::hardtanh(x, -1, 2) + F::relu6(x) + F::hardsigmoid(x) +
                        F::hardswish(x) + F::softshrink(x, 0.25) + F::hardshrink(x, 0.25) +
                        F::threshold(x, 1, -7) + F::celu(x, 1.5)),
                   0);
    CHECK_ALL_NEAR(vals(nn::Mish()(x) + nn::SELU()(x) + nn::Softsign()(x) + nn::LogSigmoid()(x) +
                        nn::Tanhshrink()(x)),
                   vals(F::mish(x) + F::selu(x) + F::softsign(x) + F::logsigmoid(x) +
                        F::tanhshrink(x)),
                   0);
    CHECK_ALL_NEAR(vals(nn::Softmax(0)(x.slice(0, 0, 12)) + nn::LogSoftmax()(x.slice(0, 0, 12))),
                   vals(x.slice(0, 0, 12).softmax(0) + x.slice(0, 0, 12).log_softmax(-1)), 0);
    nn::PReLU prelu(3);
    CHECK_ALL_NEAR(vals(prelu.weight), (Vec{0.25, 0.25, 0.25}), 0);
    prelu.weight = Tensor::from_vector(std::vector<float>{0.1f, 0.2f, 0.3f}).requires_grad();
    std::vector<float> pv = randf(24, 190);
    Tensor px = Tensor::from_vector(pv, {2, 3, 4});
    Tensor py = prelu(px);
    py.sum().backward();
    Vec want_y(24), want_w(3, 0.0);
    for (size_t i = 0; i < 24; i++) {
        size_t ch = i / 4 % 3;
        want_y[i] = pv[i] > 0 ? pv[i] : pv[i] * (0.1 * double(ch + 1));
        if (pv[i] <= 0) want_w[ch] += pv[i];
    }
    CHECK_ALL_NEAR(vals(py), want_y, F32);
    CHECK_ALL_NEAR(vals(prelu.weight.grad()), want_w, F32);
    CHECK_EQ(prelu.state_dict().count("weight"), size_t(1));
    CHECK_THROWS(F::hardtanh(x, 2, 1), "hardtanh", "min_val 2", "max_val 1");
    CHECK_THROWS(nn::Hardtanh(2, 1), "Hardtanh", "min_val 2");
    CHECK_THROWS(F::softshrink(x, -1), "softshrink", "lambd -1");
    CHECK_THROWS(nn::Softshrink(-1), "Softshrink", "lambd -1");
    CHECK_THROWS(F::celu(x, 0), "celu", "alpha");
    CHECK_THROWS(prelu(Tensor::from_vector(pv, {2, 4, 3})), "prelu", "[3]", "[4]", "[2,4,3]");
    CHECK_THROWS(nn::PReLU(0), "PReLU", "num_parameters", "0");
}

TEST(ops_activations_logsumexp_any_all_triangles) {
    Vec xv = {-30, -2, -0.5, -0.0, 0, 0.5, 2, 2.6, 30, NAN, INFINITY, -INFINITY};
    Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()));
    Tensor silu = x.silu(), leaky = x.leaky_relu(0.2), elu = x.elu(2), soft = x.softplus(2, 5);
    Tensor sign = x.sign();
    tg::realize({silu, leaky, elu, soft, sign});
    auto soft_ref = [](double v) { return 2 * v > 5 ? v : std::log1p(std::exp(2 * v)) / 2; };
    CHECK_ALL_NEAR(vals(silu), ref_unary(xv, [](double v) { return v * sigmoid(v); }), F32);
    CHECK_ALL_NEAR(vals(leaky), ref_unary(xv, [](double v) { return v > 0 ? v : 0.2 * v; }), F32);
    CHECK_ALL_NEAR(vals(elu), ref_unary(xv, [](double v) { return v > 0 ? v : 2 * std::expm1(v); }),
                   F32);
    CHECK_ALL_NEAR(vals(soft), ref_unary(xv, soft_ref), F32);
    Vec sv = vals(sign);
    CHECK_ALL_NEAR(sv, (Vec{-1, -1, -1, 0, 0, 1, 1, 1, 1, 0, 1, -1}), 0);
    CHECK(!std::signbit(sv[3]) && !std::signbit(vals(elu)[3]));   // -0 gives 0, as PyTorch's
    CHECK(x.silu().shape() == x.shape() && Tensor::from_vector({-2, 0, 3}).sign().dtype() == DType::INT32);
    CHECK(ivals(Tensor::from_vector({-2, 0, 3}).sign()) == (std::vector<int>{-1, 0, 1}));
    CHECK(Tensor::from_vector({true, false}).sign().dtype() == DType::BOOL);
    namespace F = tg::nn::functional;
    CHECK_ALL_NEAR(vals(F::silu(x) + F::leaky_relu(x) + F::elu(x) + F::softplus(x)),
                   vals(x.silu() + x.leaky_relu(0.01) + x.elu(1) + x.softplus(1, 20)), 0);
    CHECK_ALL_NEAR(vals(tg::nn::LeakyReLU(0.3)(x) + tg::nn::ELU(0.5)(x) + tg::nn::SiLU()(x) +
                        tg::nn::Softplus(3, 4)(x)),
                   vals(x.leaky_relu(0.3) + x.elu(0.5) + x.silu() + x.softplus(3, 4)), 0);

    // logsumexp: finite rows, a row of -∞ (-∞), a row with +∞ (∞), keepdim, several axes
    std::vector<float> lv = randf(24, 181, -40, 40);
    lv[4] = lv[5] = -INFINITY;   // row 1 of [.., 4]: two of four
    for (int i = 8; i < 12; i++) lv[size_t(i)] = -INFINITY;
    lv[13] = INFINITY;
    Tensor l = Tensor::from_vector(lv, {2, 3, 4});
    Vec want_rows, want_cols(8, 0.0);
    for (int r = 0; r < 6; r++) {
        double top = -INFINITY, total = 0;
        for (int c = 0; c < 4; c++) top = std::max(top, double(lv[size_t(r * 4 + c)]));
        for (int c = 0; c < 4; c++) total += std::exp(lv[size_t(r * 4 + c)] - top);
        want_rows.push_back(std::isinf(top) ? top : top + std::log(total));
    }
    Tensor rows = l.logsumexp(-1), kept = l.logsumexp(-1, true), both = l.logsumexp({0, 2});
    tg::realize({rows, kept, both});
    CHECK(rows.shape() == S({2, 3}) && kept.shape() == S({2, 3, 1}) && both.shape() == S({3}));
    CHECK_ALL_NEAR(vals(rows), want_rows, F32);
    CHECK_ALL_NEAR(vals(kept), want_rows, F32);
    for (int j = 0; j < 3; j++) {   // over axes 0 and 2: rows j and 3 + j together
        double a = want_rows[size_t(j)], b = want_rows[size_t(3 + j)], top = std::max(a, b);
        CHECK_NEAR(vals(both)[size_t(j)],
                   std::isinf(top) ? top : top + std::log(std::exp(a - top) + std::exp(b - top)), F32);
    }
    CHECK_NEAR(Tensor::from_vector({1.0, 2.0, 3.0}).logsumexp(0).item(),
               std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), F64);
    Tensor none = Tensor::zeros({0, 3}).logsumexp(0);
    CHECK(none.shape() == S({3}) && vals(none) == Vec(3, -INFINITY));

    // any / all over axes, NaN is true, nothing gives false / true
    Tensor b = Tensor::from_vector({0.f, 0.f, NAN, 0.f, 2.f, 1.f}, {2, 3});
    CHECK(b.any().dtype() == DType::BOOL && b.any().item() == 1 && b.all().item() == 0);
    CHECK(ivals(b.any(1)) == (std::vector<int>{1, 1}) && ivals(b.all(1)) == (std::vector<int>{0, 0}));
    CHECK(ivals(b.any(0)) == (std::vector<int>{0, 1, 1}) && ivals(b.all(0)) == (std::vector<int>{0, 0, 1}));
    CHECK(b.any(0, true).shape() == S({1, 3}) && b.all({0, 1}, true).shape() == S({1, 1}));
    CHECK(Tensor::zeros({0}).any().item() == 0 && Tensor::zeros({0}).all().item() == 1);
    CHECK(ivals(Tensor::from_vector({1, 0, 3}, {3}).all(0, true)) == (std::vector<int>{0}));

    // tril / triu on a batch, diagonals below, on and above, bool too
    std::vector<float> tv = randf(2 * 3 * 4, 182);
    Tensor t = Tensor::from_vector(tv, {2, 3, 4});
    for (int64_t k : {-5, -1, 0, 2, 9}) {
        Vec lower, upper;
        for (int bi = 0; bi < 2; bi++)
            for (int64_t i = 0; i < 3; i++)
                for (int64_t j = 0; j < 4; j++) {
                    double v = tv[size_t((bi * 3 + i) * 4 + j)];
                    lower.push_back(j - i <= k ? v : 0);
                    upper.push_back(j - i >= k ? v : 0);
                }
        CHECK_ALL_NEAR(vals(t.tril(k)), lower, 0);
        CHECK_ALL_NEAR(vals(t.triu(k)), upper, 0);
    }
    CHECK(ivals(Tensor::ones({2, 2}, DType::BOOL).tril()) == (std::vector<int>{1, 0, 1, 1}));
    CHECK_THROWS(Tensor::ones({3}).triu(), "triu", "[3]", "2 axes");

    // logical ops broadcast, nonzero is true
    Tensor p = Tensor::from_vector({0.f, 1.f, NAN}, {3, 1}), q = Tensor::from_vector({0, 5}, {2});
    CHECK(tg::logical_and(p, q).shape() == S({3, 2}));
    CHECK(ivals(tg::logical_and(p, q)) == (std::vector<int>{0, 0, 0, 1, 0, 1}));
    CHECK(ivals(tg::logical_or(p, q)) == (std::vector<int>{0, 1, 1, 1, 1, 1}));
    CHECK(ivals(tg::logical_xor(p, q)) == (std::vector<int>{0, 1, 1, 0, 1, 0}));
}

// norms, normalize, cosine similarity and adaptive average pooling against loops in double
TEST(ops_norm_normalize_cosine_adaptive_pool) {
    namespace F = tg::nn::functional;
    std::vector<float> xv = randf(2 * 3 * 4, 191, -3, 3);
    Tensor x = Tensor::from_vector(xv, {2, 3, 4});
    auto norm_ref = [&](double p, int axis) {   // along axis 1 or 2 of [2, 3, 4]
        Vec out;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < (axis == 1 ? 4 : 3); b++) {
                double s = 0, top = 0;
                for (int k = 0; k < (axis == 1 ? 3 : 4); k++) {
                    double e = std::fabs(xv[size_t(axis == 1 ? (a * 3 + k) * 4 + b : (a * 3 + b) * 4 + k)]);
                    s += std::pow(e, p);
                    top = std::max(top, e);
                }
                out.push_back(std::isinf(p) ? top : std::pow(s, 1 / p));
            }
        return out;
    };
    for (double p : {1.0, 2.0, 3.0, double(INFINITY)}) {
        CHECK_ALL_NEAR(vals(x.norm(p, 2)), norm_ref(p, 2), F32);
        CHECK_ALL_NEAR(vals(x.norm(p, 1, true)), norm_ref(p, 1), F32);
    }
    CHECK(x.norm(2, 1, true).shape() == S({2, 1, 4}) && x.norm().shape() == S({}));
    double total = 0;
    for (float e : xv) total += double(e) * e;
    CHECK_NEAR(x.norm().item(), std::sqrt(total), F32);
    CHECK_NEAR(Tensor::from_vector({3, 4}).norm().item(), 5, F32);   // ints as float
    CHECK_THROWS(x.norm(0), "norm", "p must be > 0", "0");
    CHECK_THROWS(x.norm(-1, 1), "norm", "-1");

    // normalize: x / max(‖x‖, eps); a zero row stays zero
    Vec n2 = norm_ref(2, 1), got = vals(F::normalize(x));
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 4; b++) {
                size_t at = size_t((a * 3 + k) * 4 + b);
                CHECK_NEAR(got[at], xv[at] / n2[size_t(a * 4 + b)], F32);
            }
    CHECK_ALL_NEAR(vals(F::normalize(Tensor::zeros({2, 3}), 2, -1)), Vec(6, 0.0), 0);
    CHECK_ALL_NEAR(vals(F::normalize(x, 1, 2).abs().sum(2)), Vec(6, 1.0), F32);

    // cosine similarity along the last axis, the second operand broadcast
    std::vector<float> yv = randf(4, 192, -3, 3);
    Tensor y = Tensor::from_vector(yv, {4});
    Vec cs = vals(F::cosine_similarity(x, y, -1)), want;
    for (int r = 0; r < 6; r++) {
        double dot = 0, nx = 0, ny = 0;
        for (int k = 0; k < 4; k++) {
            dot += double(xv[size_t(r * 4 + k)]) * yv[size_t(k)];
            nx += double(xv[size_t(r * 4 + k)]) * xv[size_t(r * 4 + k)];
            ny += double(yv[size_t(k)]) * yv[size_t(k)];
        }
        want.push_back(dot / std::sqrt(nx) / std::sqrt(ny));
    }
    CHECK_ALL_NEAR(cs, want, F32);
    CHECK(F::cosine_similarity(x, y, -1).shape() == S({2, 3}));
    CHECK_ALL_NEAR(vals(F::cosine_similarity(Tensor::zeros({2, 3}), Tensor::ones({2, 3}))),
                   Vec(2, 0.0), 0);
    CHECK_THROWS(F::cosine_similarity(x, Tensor::ones({3})), "cosine_similarity", "[2,3,4]", "[3]");

    // adaptive average pooling: bins that overlap (7 -> 3), more bins than inputs (3 -> 5),
    // and one bin; an ∞ stays in its bins
    std::vector<float> pv = randf(2 * 7 * 3, 193, -2, 2);
    pv[0] = INFINITY;   // [0, 0, 0]
    Tensor px = Tensor::from_vector(pv, {2, 7, 3});
    auto bins = [](int64_t n, int64_t out) {
        std::vector<std::pair<int64_t, int64_t>> b;
        for (int64_t i = 0; i < out; i++) b.push_back({i * n / out, ((i + 1) * n + out - 1) / out});
        return b;
    };
    for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {1, 1}, {7, 3}, {4, 2}}) {
        Vec ref;
        for (int c = 0; c < 2; c++)
            for (auto [h0, h1] : bins(7, oh))
                for (auto [w0, w1] : bins(3, ow)) {
                    double s = 0;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) s += pv[size_t((c * 7 + h) * 3 + w)];
                    ref.push_back(s / double((h1 - h0) * (w1 - w0)));
                }
        Tensor pooled = F::adaptive_avg_pool2d(px, {oh, ow});
        CHECK(pooled.shape() == S({2, oh, ow}));
        CHECK_ALL_NEAR(vals(pooled), ref, F32);
    }
    CHECK_ALL_NEAR(vals(tg::nn::AdaptiveAvgPool2d(1)(px.unsqueeze(0))),
                   vals(px.mean({1, 2}, true).unsqueeze(0)), F32);
    Vec one = vals(F::adaptive_avg_pool1d(px, 2));
    CHECK(F::adaptive_avg_pool1d(px, 2).shape() == S({2, 7, 2}));
    CHECK_NEAR(one[1], (pv[1] + pv[2]) / 2.0, F32);   // row 0: bins [0, 2) and [1, 3)
    CHECK_THROWS(F::adaptive_avg_pool2d(px.reshape({42}), 2), "adaptive_avg_pool2d", "[42]");
    CHECK_THROWS(F::adaptive_avg_pool2d(px, {2, 0}), "adaptive_avg_pool2d", "output_size");
    CHECK_THROWS(F::adaptive_avg_pool1d(Tensor::ones({2, 3}, DType::INT32), 2),
                 "adaptive_avg_pool1d", "int32");
}

// conv_transpose against a scatter in double: x[n, c, i] · w[c, o, k] lands on output
// i·stride - padding + k·dilation; the gradients of Σ y·r likewise
TEST(ops_conv_transpose_matches_scatter_values_and_gradients) {
    namespace F = tg::nn::functional;
    struct Case {
        Shape x, w;
        Idx stride, padding, output_padding, dilation;
        int64_t groups;
        bool bias;
    };
    const std::vector<Case> cases = {
        {{2, 3, 5}, {3, 4, 3}, {1}, {0}, {0}, {1}, 1, true},                      // 1d
        {{2, 4, 4}, {4, 2, 3}, {2}, {1}, {1}, {1}, 2, false},                     // grouped
        {{2, 3, 4, 3}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 0}, {1, 1}, 1, true},    // 2d
        {{1, 2, 3, 4}, {2, 3, 2, 3}, {3, 1}, {0, 2}, {2, 0}, {1, 2}, 1, true},    // per axis
        {{1, 2, 3, 3}, {2, 1, 3, 2}, {1, 3}, {3, 2}, {0, 1}, {2, 1}, 2, true},    // cut padding
        // dilation 1, by phases: a phase without taps (kernel 2 < stride 3), a padding past
        // the first phase, the common 4 x 4 kernel of stride 2
        {{2, 2, 4, 3}, {2, 3, 4, 2}, {2, 3}, {1, 0}, {0, 2}, {1, 1}, 1, true},
        {{1, 2, 3, 4}, {2, 2, 3, 5}, {2, 2}, {2, 3}, {1, 0}, {1, 1}, 2, false},
        {{2, 3, 5, 5}, {3, 2, 4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}, 1, true},
        // 3d: by phases (grouped), and dilated
        {{1, 4, 3, 2, 3}, {4, 1, 3, 2, 2}, {2, 1, 3}, {1, 0, 1}, {1, 0, 2}, {1, 1, 1}, 2, true},
        {{2, 2, 2, 3, 2}, {2, 2, 2, 2, 3}, {2, 2, 1}, {0, 1, 1}, {0, 1, 0}, {2, 2, 1}, 1, false},
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const Case& c = cases[i];
        const size_t axes = c.x.size() - 2;
        const int64_t c_out = c.w[1] * c.groups, in_group = c.x[1] / c.groups;
        Shape ys = {c.x[0], c_out};
        for (size_t a = 0; a < axes; a++)
            ys.push_back((c.x[a + 2] - 1) * c.stride[a] - 2 * c.padding[a] +
                         c.dilation[a] * (c.w[a + 2] - 1) + c.output_padding[a] + 1);
        std::vector<float> xv = randf(size_t(count(c.x)), 350 + i), wv = randf(size_t(count(c.w)), 360 + i),
                           bv = c.bias ? randf(size_t(c_out), 370 + i) : std::vector<float>{},
                           rv = randf(size_t(count(ys)), 380 + i);
        Vec y(size_t(count(ys)), 0.0), dx(xv.size(), 0.0), dw(wv.size(), 0.0), db(bv.size(), 0.0);
        for (int64_t o = 0; o < count(ys); o++)
            if (c.bias) {
                int64_t ch = unravel(o, ys)[1];
                y[size_t(o)] += bv[size_t(ch)];
                db[size_t(ch)] += rv[size_t(o)];
            }
        Shape kernel(c.w.begin() + 2, c.w.end());
        for (int64_t xf = 0; xf < count(c.x); xf++) {
            Idx xi = unravel(xf, c.x);
            for (int64_t oc = 0; oc < c.w[1]; oc++)
                for (int64_t p = 0; p < count(kernel); p++) {
                    Idx k = unravel(p, kernel), yi = {xi[0], xi[1] / in_group * c.w[1] + oc}, wi = {xi[1], oc};
                    bool inside = true;
                    for (size_t a = 0; a < axes; a++) {
                        int64_t at = xi[a + 2] * c.stride[a] - c.padding[a] + k[a] * c.dilation[a];
                        inside = inside && at >= 0 && at < ys[a + 2];
                        yi.push_back(at);
                        wi.push_back(k[a]);
                    }
                    if (!inside) continue;
                    size_t yf = size_t(ravel(yi, ys)), wf = size_t(ravel(wi, c.w));
                    y[yf] += double(xv[size_t(xf)]) * wv[wf];
                    dx[size_t(xf)] += double(rv[yf]) * wv[wf];
                    dw[wf] += double(rv[yf]) * xv[size_t(xf)];
                }
        }
        Tensor x = Tensor::from_vector(xv, c.x).requires_grad(), w = Tensor::from_vector(wv, c.w).requires_grad();
        Tensor b = c.bias ? Tensor::from_vector(bv, {c_out}).requires_grad() : Tensor();
        auto sizes = [](const Idx& v) {
            tg::nn::SpatialSizes s;
            s.sizes = v;
            return s;
        };
        auto convt = axes == 1 ? F::conv_transpose1d : axes == 2 ? F::conv_transpose2d : F::conv_transpose3d;
        Tensor out = convt(x, w, b, sizes(c.stride), sizes(c.padding), sizes(c.output_padding), c.groups,
                           sizes(c.dilation), tg::Loc::here());
        (out * Tensor::from_vector(rv, ys)).sum().backward();
        CHECK(out.shape() == ys);
        CHECK_ALL_NEAR(vals(out), y, F32);
        CHECK_ALL_NEAR(vals(x.grad()), dx, F32);
        CHECK_ALL_NEAR(vals(w.grad()), dw, F32);
        if (c.bias) CHECK_ALL_NEAR(vals(b.grad()), db, F32);
        if (th::failures()) std::fprintf(stderr, "  in case %zu\n", i);
    }
    // without the batch axis; the layer is the function with its parameters
    Tensor x = Tensor::randn({2, 3, 3}), w = Tensor::randn({2, 4, 2, 2});
    CHECK_ALL_NEAR(vals(F::conv_transpose2d(x, w, Tensor(), 2)),
                   vals(F::conv_transpose2d(x.unsqueeze(0), w, Tensor(), 2).squeeze(0)), 0);
    tg::nn::ConvTranspose2d layer(2, 6, 3, 2, 1, 1, 2);
    CHECK(layer.weight.shape() == S({2, 3, 3, 3}) && layer.bias.shape() == S({6}));
    Vec wl = vals(layer.weight);
    double bound = 1 / std::sqrt(27.0);   // fan_in: out / groups · 3 · 3
    CHECK(*std::max_element(wl.begin(), wl.end()) <= bound && *std::min_element(wl.begin(), wl.end()) >= -bound);
    CHECK(layer(x.unsqueeze(0)).shape() == S({1, 6, 6, 6}));
    CHECK_ALL_NEAR(vals(layer(x.unsqueeze(0))),
                   vals(F::conv_transpose2d(x.unsqueeze(0), layer.weight, layer.bias, 2, 1, 1, 2)), 0);
    CHECK_THROWS(F::conv_transpose2d(x, Tensor::randn({3, 4, 2, 2})), "conv_transpose2d",
                 "[2,3,3]", "[3,4,2,2]", "axis 0 must be C_in");
    CHECK_THROWS(F::conv_transpose2d(x, w, Tensor(), 2, 0, 2), "conv_transpose2d", "output_padding",
                 "less than the stride");
    CHECK_THROWS(F::conv_transpose2d(x, w, Tensor(), 1, 3), "conv_transpose2d", "empty");
    CHECK_THROWS(F::conv_transpose1d(x, w), "conv_transpose1d", "weight must be [C_in, C_out / groups, 1");
    CHECK_THROWS(tg::nn::ConvTranspose1d(3, 4, 2, 1, 0, 0, 2), "ConvTranspose1d", "groups 2");
    tg::nn::ConvTranspose3d layer3(2, 4, {3, 2, 2}, 2, 1, {1, 0, 1});
    Tensor x3 = Tensor::randn({1, 2, 3, 2, 2});
    CHECK(layer3.weight.shape() == S({2, 4, 3, 2, 2}));
    CHECK(layer3(x3).shape() == S({1, 4, 6, 2, 3}));
    CHECK_ALL_NEAR(vals(layer3(x3)), vals(F::conv_transpose3d(x3, layer3.weight, layer3.bias, 2, 1, {1, 0, 1})), 0);
}

// the schedules against PyTorch's closed forms, steps 1..12 at once; roll and lerp
TEST(ops_lr_schedules_roll_lerp) {
    namespace O = tg::optim;
    Tensor t = Tensor::arange(1, 13).cast(DType::FLOAT32);
    Vec step = vals(O::step_lr(0.5, 4, 0.1)(t)), expo = vals(O::exponential_lr(0.5, 0.9)(t));
    Vec cosine = vals(O::cosine_annealing_lr(0.5, 10, 0.05)(t));
    Vec linear = vals(O::linear_lr(0.5, 0.25, 1.0, 6)(t));
    for (int i = 0; i < 12; i++) {   // step i + 1 after i scheduler steps
        CHECK_NEAR(step[size_t(i)], 0.5 * std::pow(0.1, i / 4), 1e-6);
        CHECK_NEAR(expo[size_t(i)], 0.5 * std::pow(0.9, i), 1e-6);
        CHECK_NEAR(cosine[size_t(i)], 0.05 + 0.45 * (1 + std::cos(M_PI * i / 10)) / 2, 1e-6);
        CHECK_NEAR(linear[size_t(i)], 0.5 * (0.25 + 0.75 * std::min(i, 6) / 6.0), 1e-6);
    }
    // every step size to 2000 decays at its step: (t - 1)·(1/41) rounds below 1 at t = 42
    Tensor steps = Tensor::arange(1, 2001).cast(DType::FLOAT32);
    for (int64_t size : {41, 47, 83, 97, 1000, 1999}) {
        Vec lr = vals(O::step_lr(1, size, 0.5)(steps));
        for (int64_t i = 0; i < 2000; i++)
            if (lr[size_t(i)] != std::ldexp(1.0, -int(i / size)))
                th::report(__FILE__, __LINE__, "step_lr, step size " + std::to_string(size) +
                                                   ", step " + std::to_string(i + 1));
    }
    // MultiStepLR (a milestone given twice counts twice) and OneCycleLR: PyTorch 1.13's rates
    Vec multi = vals(O::multi_step_lr(0.5, {2, 5, 9, 5}, 0.5)(t));
    Vec one_cos = vals(O::one_cycle_lr(0.5, 12)(t));
    Vec one_lin3 = vals(O::one_cycle_lr(0.5, 12, 0.25, false, 10, 100, true)(t));
    CHECK_ALL_NEAR(multi, (Vec{0.5, 0.5, 0.25, 0.25, 0.25, 0.0625, 0.0625, 0.0625, 0.0625, 0.03125,
                               0.03125, 0.03125}), 1e-7);
    CHECK_ALL_NEAR(one_cos, (Vec{0.02, 0.1748948271, 0.4396425796, 0.4972077177, 0.4665064849,
                                 0.405872827, 0.3236894988, 0.2313185513, 0.1415304991,
                                 0.0667387651, 0.0172834937, 2e-06}), 1e-6);
    CHECK_ALL_NEAR(one_lin3, (Vec{0.05, 0.275, 0.5, 0.275, 0.05, 0.0429285714, 0.0358571429,
                                  0.0287857143, 0.0217142857, 0.0146428571, 0.0075714286, 0.0005}),
                   1e-6);
    CHECK_NEAR(vals(O::one_cycle_lr(0.5, 12)(t + 20.0f)).back(), 2e-6, 1e-6);   // past the end
    // ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts, CyclicLR: PyTorch 1.13's rates
    Tensor t16 = Tensor::arange(1, 17).cast(DType::FLOAT32), t14 = t16.slice(0, 0, 14);
    CHECK_ALL_NEAR(vals(O::constant_lr(0.5, 0.25, 4)(t)),
                   (Vec{0.125, 0.125, 0.125, 0.125, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}), 1e-7);
    CHECK_ALL_NEAR(vals(O::polynomial_lr(0.5, 8, 2)(t)),
                   (Vec{0.5, 0.3828125, 0.28125, 0.1953125, 0.125, 0.0703125, 0.03125, 0.0078125,
                        0, 0, 0, 0}), 1e-7);
    CHECK_ALL_NEAR(vals(O::cosine_annealing_warm_restarts(0.5, 4, 1, 0.05)(t)),
                   (Vec{0.5, 0.4340990258, 0.275, 0.1159009742, 0.5, 0.4340990258, 0.275,
                        0.1159009742, 0.5, 0.4340990258, 0.275, 0.1159009742}), 1e-6);
    CHECK_ALL_NEAR(vals(O::cosine_annealing_warm_restarts(0.5, 2, 2, 0.05)(t16)),
                   (Vec{0.5, 0.275, 0.5, 0.4340990258, 0.275, 0.1159009742, 0.5, 0.4828728948,
                        0.4340990258, 0.3611037723, 0.275, 0.1888962277, 0.1159009742,
                        0.06712710518, 0.5, 0.4956766881}), 1e-6);
    CHECK_ALL_NEAR(vals(O::cosine_annealing_warm_restarts(0.5, 3, 3)(t16)),
                   (Vec{0.5, 0.375, 0.125, 0.5, 0.4849231552, 0.4415111108, 0.375, 0.2934120444,
                        0.2065879556, 0.125, 0.05848888922, 0.0150768448, 0.5, 0.4983095894,
                        0.4932612176, 0.4849231552}), 1e-6);
    CHECK_ALL_NEAR(vals(O::cyclic_lr(0.1, 0.5, 3)(t14)),
                   (Vec{0.1, 0.2333333333, 0.3666666667, 0.5, 0.3666666667, 0.2333333333, 0.1,
                        0.2333333333, 0.3666666667, 0.5, 0.3666666667, 0.2333333333, 0.1,
                        0.2333333333}), 1e-6);
    CHECK_ALL_NEAR(vals(O::cyclic_lr(0.1, 0.5, 2, 3, "triangular2")(t14)),
                   (Vec{0.1, 0.3, 0.5, 0.3666666667, 0.2333333333, 0.1, 0.2, 0.3, 0.2333333333,
                        0.1666666667, 0.1, 0.15, 0.2, 0.1666666667}), 1e-6);
    CHECK_ALL_NEAR(vals(O::cyclic_lr(0.1, 0.5, 2, std::nullopt, "exp_range", 0.9)(t14)),
                   (Vec{0.1, 0.28, 0.424, 0.2458, 0.1, 0.218098, 0.3125764, 0.19565938, 0.1,
                        0.1774840978, 0.239471376, 0.1627621192, 0.1, 0.1508373166}), 1e-6);
    CHECK_THROWS(O::constant_lr(0.1, 1.5), "constant_lr", "factor");
    CHECK_THROWS(O::polynomial_lr(0.1, 0), "polynomial_lr", "total_iters");
    CHECK_THROWS(O::cosine_annealing_warm_restarts(0.1, 0), "cosine_annealing_warm_restarts",
                 "t_0");
    CHECK_THROWS(O::cyclic_lr(0.1, 0.5, 2, 2, "sine"), "cyclic_lr", "sine");
    // no warm-up step where pct_start·total_steps < 1, as PyTorch's; gamma 0 stops at a milestone
    Tensor t4 = t.slice(0, 0, 4);
    CHECK_ALL_NEAR(vals(O::one_cycle_lr(0.1, 3)(t4.slice(0, 0, 3))),
                   (Vec{0.0994415435, 0.0462637103, 4e-07}), 1e-6);
    CHECK_ALL_NEAR(vals(O::multi_step_lr(0.1, {2}, 0)(t4)), (Vec{0.1, 0.1, 0, 0}), 1e-7);
    CHECK_THROWS(O::multi_step_lr(0.1, {1}, -1), "multi_step_lr", "gamma >= 0");
    CHECK_THROWS(O::one_cycle_lr(0.1, 10, 0.1), "one_cycle_lr", "total_steps 10",
                 "ends where it starts");
    CHECK_THROWS(O::step_lr(0.1, 0), "step_lr", "step_size 0");
    CHECK_THROWS(O::exponential_lr(0.1, 0), "exponential_lr", "gamma > 0");
    CHECK_THROWS(O::cosine_annealing_lr(0.1, 0), "cosine_annealing_lr", "t_max >= 1");
    CHECK_THROWS(O::linear_lr(0.1, 0), "linear_lr", "start_factor");

    Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(ivals(x.roll(1, 1)) == (std::vector<int>{3, 1, 2, 6, 4, 5}));
    CHECK(ivals(x.roll(-4, -1)) == (std::vector<int>{2, 3, 1, 5, 6, 4}));   // -4 mod 3 = 2
    CHECK(ivals(x.roll({1, 2}, {0, 1})) == (std::vector<int>{5, 6, 4, 2, 3, 1}));
    CHECK(ivals(x.roll(3, 1)) == ivals(x));
    CHECK_THROWS(x.roll({1}, {0, 1}), "roll", "1 shifts for 2 axes");
    CHECK_THROWS(x.roll(1, 2), "roll");

    Tensor a = Tensor::from_vector({1.f, -2.f, 1e8f}), b = Tensor::from_vector({3.f, 5.f, 1.f});
    Tensor w = Tensor::from_vector({0.25f, 1.f, 1.f});
    CHECK_ALL_NEAR(vals(a.lerp(b, w)), (Vec{1.5, 5, 1}), 0);   // exact at weight 1
    CHECK_ALL_NEAR(vals(a.lerp(b, 0.75)), (Vec{2.5, 3.25, 1e8 * 0.25 + 0.75}), F32);
    CHECK_ALL_NEAR(vals(a.lerp(b, 1.0)), (Vec{3, 5, 1}), 0);
}

// interpolate and Upsample against loops in double: each output reads one input (nearest) or
// weighs two (linear, bilinear, trilinear) or four (bicubic: Keys' cubic, a = -0.75), one axis
// at a time. A scale is a
// scale_factor(...), never a number where a size goes:
static_assert(!std::is_convertible_v<double, tg::nn::SpatialSizes>, "2.5 is not a size");
static_assert(std::is_convertible_v<int, tg::nn::SpatialSizes>, "a size");
TEST(ops_interpolate_and_upsample) {
    namespace F = tg::nn::functional;
    using Taps = std::vector<std::vector<std::pair<int64_t, double>>>;   // per output: (input, weight)
    auto taps = [](int64_t in, int64_t out, double scale, const std::string& mode, bool corners) {
        Taps t{size_t(out)};
        if (corners) scale = out > 1 ? double(in - 1) / double(out - 1) : 0;
        for (int64_t o = 0; o < out; o++) {
            if (mode == "nearest" || mode == "nearest-exact") {
                double src = mode == "nearest" ? o * scale : (o + 0.5) * scale;
                t[size_t(o)] = {{std::min<int64_t>(int64_t(std::floor(src)), in - 1), 1.0}};
                continue;
            }
            if (mode == "bicubic") {   // taps at first - 1 .. first + 2, clamped to the edges
                double src = corners ? o * scale : (o + 0.5) * scale - 0.5, f = std::floor(src);
                auto keys = [](double d) {
                    const double a = -0.75;
                    d = std::fabs(d);
                    return d <= 1 ? ((a + 2) * d - (a + 3)) * d * d + 1
                                  : ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
                };
                for (int k = -1; k <= 2; k++)
                    t[size_t(o)].push_back({std::clamp<int64_t>(int64_t(f) + k, 0, in - 1),
                                            keys(src - (f + k))});
                continue;
            }
            double src = corners ? o * scale : std::max(0.0, (o + 0.5) * scale - 0.5);
            int64_t low = std::min<int64_t>(int64_t(std::floor(src)), in - 1);
            double w = src - double(low);
            t[size_t(o)] = {{low, 1 - w}, {std::min(low + 1, in - 1), w}};
        }
        return t;
    };
    std::vector<float> xv = randf(2 * 3 * 5 * 4, 401, -2, 2);
    Tensor x = Tensor::from_vector(xv, {2, 3, 5, 4});
    auto ref2d = [&](const Taps& th_, const Taps& tw) {
        Vec y;
        for (int nc = 0; nc < 6; nc++)
            for (const auto& hs : th_)
                for (const auto& ws : tw) {
                    double acc = 0;
                    for (auto [h, wh] : hs)
                        for (auto [w, ww] : ws) acc += wh * ww * xv[size_t((nc * 5 + h) * 4 + w)];
                    y.push_back(acc);
                }
        return y;
    };
    struct Case { int64_t h, w; const char* mode; bool corners; };
    for (Case c : {Case{7, 9, "nearest", false}, Case{3, 3, "nearest", false},
                   Case{7, 9, "nearest-exact", false}, Case{7, 9, "bilinear", false},
                   Case{3, 2, "bilinear", false}, Case{7, 9, "bilinear", true},
                   Case{1, 1, "bilinear", true}, Case{7, 9, "bicubic", false},
                   Case{3, 2, "bicubic", false}, Case{7, 9, "bicubic", true},
                   Case{1, 1, "bicubic", true}}) {
        Tensor y = F::interpolate(x, {c.h, c.w}, c.mode, c.corners);
        CHECK(y.shape() == S({2, 3, c.h, c.w}));
        CHECK_ALL_NEAR(vals(y), ref2d(taps(5, c.h, 5.0 / double(c.h), c.mode, c.corners),
                                      taps(4, c.w, 4.0 / double(c.w), c.mode, c.corners)), F32);
        if (th::failures())
            std::fprintf(stderr, "  in %s %lldx%lld\n", c.mode, (long long)c.h, (long long)c.w);
    }
    CHECK_ALL_NEAR(vals(F::interpolate(x, {2, 3}, "area")), vals(F::adaptive_avg_pool2d(x, {2, 3})), 0);
    // Upsample reads at o / scale_factor (not in / out): 5 * 1.7 -> 8, 4 * 1.7 -> 6
    CHECK_ALL_NEAR(vals(tg::nn::Upsample(1.7)(x)),
                   ref2d(taps(5, 8, 1 / 1.7, "nearest", false), taps(4, 6, 1 / 1.7, "nearest", false)), F32);
    CHECK_ALL_NEAR(vals(tg::nn::Upsample(2.5, "bilinear")(x)),
                   ref2d(taps(5, 12, 1 / 2.5, "bilinear", false), taps(4, 10, 1 / 2.5, "bilinear", false)),
                   F32);
    CHECK_ALL_NEAR(vals(tg::nn::Upsample({6, 7}, "bicubic", true)(x)),
                   vals(F::interpolate(x, {6, 7}, "bicubic", true)), 0);
    // interpolate by scale_factor: to ⌊in·scale⌋, reading at o / scale, or at o·in/out where
    // the scale is recomputed
    using tg::nn::scale_factor;
    CHECK_ALL_NEAR(vals(F::interpolate(x, scale_factor(1.7), "bilinear")),
                   ref2d(taps(5, 8, 1 / 1.7, "bilinear", false), taps(4, 6, 1 / 1.7, "bilinear", false)),
                   F32);
    CHECK_ALL_NEAR(vals(F::interpolate(x, scale_factor(1.7), "bilinear", false, true)),
                   vals(F::interpolate(x, {8, 6}, "bilinear")), 0);
    Tensor scaled = F::interpolate(x, scale_factor({2.2, 0.6}), "bicubic");
    CHECK(scaled.shape() == S({2, 3, 11, 2}));
    CHECK_ALL_NEAR(vals(scaled), ref2d(taps(5, 11, 1 / 2.2, "bicubic", false),
                                       taps(4, 2, 1 / 0.6, "bicubic", false)), F32);
    CHECK_ALL_NEAR(vals(F::interpolate(x, scale_factor(0.5), "area")),
                   vals(F::adaptive_avg_pool2d(x, {2, 2})), 0);
    // one axis: linear, a float64 input keeps its precision
    Vec lv = randd(2 * 20, 402);
    Taps tl = taps(20, 31, 20.0 / 31, "linear", false);
    Vec want;
    for (int r = 0; r < 2; r++)
        for (const auto& ts : tl) {
            double acc = 0;
            for (auto [i, w] : ts) acc += w * lv[size_t(r * 20 + i)];
            want.push_back(acc);
        }
    CHECK_ALL_NEAR(vals(F::interpolate(Tensor::from_vector(lv, {1, 2, 20}), 31, "linear")), want, 1e-12);
    // three axes: trilinear (the last axis first), nearest; Upsample by a scale
    std::vector<float> v3 = randf(2 * 3 * 4 * 5, 403, -2, 2);
    Tensor x3 = Tensor::from_vector(v3, {1, 2, 3, 4, 5});
    auto ref3d = [&](const Taps& td, const Taps& th_, const Taps& tw) {
        Vec y;
        for (int c = 0; c < 2; c++)
            for (const auto& ds : td)
                for (const auto& hs : th_)
                    for (const auto& ws : tw) {
                        double acc = 0;
                        for (auto [d, wd] : ds)
                            for (auto [h, wh] : hs)
                                for (auto [w, ww] : ws)
                                    acc += wd * wh * ww * v3[size_t(((c * 3 + d) * 4 + h) * 5 + w)];
                        y.push_back(acc);
                    }
        return y;
    };
    struct Case3 { int64_t d, h, w; const char* mode; bool corners; };
    for (Case3 c : {Case3{4, 6, 3, "trilinear", false}, Case3{5, 2, 7, "trilinear", true},
                    Case3{1, 1, 1, "trilinear", true}, Case3{5, 7, 2, "nearest", false}}) {
        Tensor y = F::interpolate(x3, {c.d, c.h, c.w}, c.mode, c.corners);
        CHECK(y.shape() == S({1, 2, c.d, c.h, c.w}));
        std::string m = c.mode == std::string("trilinear") ? "linear" : c.mode;
        CHECK_ALL_NEAR(vals(y), ref3d(taps(3, c.d, 3.0 / double(c.d), m, c.corners),
                                      taps(4, c.h, 4.0 / double(c.h), m, c.corners),
                                      taps(5, c.w, 5.0 / double(c.w), m, c.corners)), F32);
        if (th::failures())
            std::fprintf(stderr, "  in %s %lldx%lldx%lld\n", c.mode, (long long)c.d,
                         (long long)c.h, (long long)c.w);
    }
    CHECK_ALL_NEAR(vals(tg::nn::Upsample(1.5, "trilinear")(x3)),
                   ref3d(taps(3, 4, 1 / 1.5, "linear", false), taps(4, 6, 1 / 1.5, "linear", false),
                         taps(5, 7, 1 / 1.5, "linear", false)), F32);
    CHECK_THROWS(F::interpolate(x, {7, 9}, "trilinear"), "interpolate", "trilinear needs 3",
                 "[2,3,5,4]");
    CHECK_THROWS(F::interpolate(x3, {7, 9, 2}, "bilinear"), "interpolate", "bilinear needs 2");
    CHECK_THROWS(F::interpolate(x, {7, 9}, "cubic"), "interpolate", "\"cubic\"", "trilinear");
    CHECK_THROWS(F::interpolate(x, {7, 9}, "linear"), "interpolate", "linear needs 1", "[2,3,5,4]");
    CHECK_THROWS(F::interpolate(Tensor::from_vector(lv, {1, 2, 20}), 31, "bicubic"), "interpolate",
                 "bicubic needs 2", "[1,2,20]");
    CHECK_THROWS(F::interpolate(x, {7, 9}, "nearest", true), "interpolate", "align_corners");
    CHECK_THROWS(F::interpolate(x, {7, 9, 2}), "interpolate", "[2,3,5,4]", "[7,9,2]");
    CHECK_THROWS(F::interpolate(x, {0, 2}), "interpolate", "size");
    CHECK_THROWS(F::interpolate(x, scale_factor({2, 2, 2})), "interpolate", "scale_factor",
                 "(2, 2, 2)", "[2,3,5,4]");
    CHECK_THROWS(F::interpolate(x, scale_factor(0.1)), "interpolate", "at least 1", "(0.1)");
    CHECK_THROWS(F::interpolate(x, scale_factor(-2)), "interpolate", "positive", "(-2)");
    CHECK_THROWS(tg::nn::Upsample(0)(x), "Upsample", "scale_factor", "(0)");
    CHECK_THROWS(tg::nn::Upsample({6, 7, 8})(x), "Upsample", "size", "[6,7,8]");
}

// Nearest resizing by a power of two is a view: each input repeated (⌊o/k⌋ is o >> log2 k
// exactly), no index computed in float and gathered, and its gradient sums each input's
// copies (no scatter). The values and gradients of loops; other factors still gather.
TEST(ops_interpolate_nearest_by_a_power_of_two_is_a_view) {
    namespace F = tg::nn::functional;
    std::vector<float> xv = randf(2 * 3 * 5 * 4, 404, -2, 2);
    Tensor x = Tensor::from_vector(xv, {2, 3, 5, 4}).requires_grad();
    for (const char* mode : {"nearest", "nearest-exact"})
        for (auto [h, w] : {std::pair<int64_t, int64_t>{10, 16}, {20, 8}}) {
            Tensor y = F::interpolate(x, {h, w}, mode);
            std::string graph = tg::inspect({y}).graph;
            CHECK(graph.find("GATHER") == std::string::npos);
            CHECK(graph.find("EXPAND") != std::string::npos);
            Vec want, weights = randd(size_t(6 * h * w), 405), grad(xv.size(), 0.0);
            for (int64_t nc = 0; nc < 6; nc++)
                for (int64_t i = 0; i < h; i++)
                    for (int64_t j = 0; j < w; j++) {
                        size_t from = size_t((nc * 5 + i / (h / 5)) * 4 + j / (w / 4));
                        want.push_back(xv[from]);
                        grad[from] += weights[size_t((nc * h + i) * w + j)];
                    }
            CHECK_ALL_NEAR(vals(y), want, 0);
            Tensor weight = Tensor::from_vector(weights, {2, 3, h, w}).cast(tg::DType::FLOAT32);
            Tensor loss = (y * weight).sum();
            Tensor g = tg::gradients(loss, {x})[0];
            CHECK(tg::inspect({g}).graph.find("SCATTER") == std::string::npos);
            CHECK_ALL_NEAR(vals(g), grad, 1e-5);
        }
    CHECK(tg::inspect({F::interpolate(x, {15, 8}, "nearest")}).graph.find("GATHER") !=
          std::string::npos);
    CHECK_ALL_NEAR(vals(tg::nn::Upsample(2.0)(x)), vals(F::interpolate(x, {10, 8})), 0);
}

// F.pad's modes against loops: output o of a padded axis reads input o - before, mirrored,
// clamped or wrapped
TEST(ops_pad_modes) {
    namespace F = tg::nn::functional;
    std::vector<float> xv = randf(2 * 3 * 4, 411);
    Tensor x = Tensor::from_vector(xv, {2, 3, 4});
    auto source = [](const std::string& mode, int64_t i, int64_t n) {
        if (mode == "replicate") return std::clamp<int64_t>(i, 0, n - 1);
        if (mode == "circular") return ((i % n) + n) % n;
        if (i < 0) i = -i;                              // reflect
        return i >= n ? 2 * (n - 1) - i : i;
    };
    for (std::string mode : {"constant", "reflect", "replicate", "circular"}) {
        Vec want;   // pads {1, 2, 2, 1}: last axis 1 before, 2 after; axis 1 2 before, 1 after
        for (int64_t b = 0; b < 2; b++)
            for (int64_t i = -2; i < 4; i++)
                for (int64_t j = -1; j < 6; j++) {
                    bool inside = i >= 0 && i < 3 && j >= 0 && j < 4;
                    if (mode == "constant")
                        want.push_back(inside ? xv[size_t((b * 3 + i) * 4 + j)] : 7.0);
                    else
                        want.push_back(xv[size_t((b * 3 + source(mode, i, 3)) * 4 + source(mode, j, 4))]);
                }
        Tensor y = F::pad(x, {1, 2, 2, 1}, mode, 7);
        CHECK(y.shape() == S({2, 6, 7}));
        CHECK_ALL_NEAR(vals(y), want, 0);
        if (th::failures()) std::fprintf(stderr, "  in mode %s\n", mode.c_str());
    }
    // constant: a negative size cuts; one pair pads the last axis only
    CHECK_ALL_NEAR(vals(F::pad(x, {-1, 2, 0, -2}, "constant", 5)),
                   vals(x.slice(1, 0, 1).slice(2, 1, 4).pad({{0, 0}, {0, 0}, {0, 2}}, 5)), 0);
    CHECK(F::pad(x, {3, 0}, "reflect").shape() == S({2, 3, 7}));
    // every mode: a negative size cuts, as PyTorch's, before or after the padding
    Tensor r = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f}, {1, 5});
    CHECK_ALL_NEAR(vals(F::pad(r, {-1, 2}, "replicate")), (Vec{2, 3, 4, 5, 5, 5}), 0);
    CHECK_ALL_NEAR(vals(F::pad(r, {2, -2}, "reflect")), (Vec{3, 2, 1, 2, 3}), 0);
    CHECK_ALL_NEAR(vals(F::pad(r, {-2, 1}, "circular")), (Vec{3, 4, 5, 1}), 0);
    CHECK_THROWS(F::pad(r, {-3, -3}, "replicate"), "pad", "below nothing");
    CHECK_THROWS(F::pad(r.slice(1, 0, 0), {1, 0}, "replicate"), "pad", "empty");
    CHECK_THROWS(F::pad(x, {4, 0}, "reflect"), "pad", "reflect", "at most the axis's size - 1");
    CHECK_THROWS(F::pad(x, {5, 0}, "circular"), "pad", "circular", "[5,0]");
    CHECK_THROWS(F::pad(x, {1, 1, 1}), "pad", "3 sizes", "[2,3,4]");
    CHECK_THROWS(F::pad(x, {1, 1}, "mirror"), "pad", "mirror", "reflect");
    CHECK_THROWS(F::pad(x, {-3, -2}), "pad", "[-3,-2]", "below nothing");
}
