// Fuzz targets: the safetensors loader and the einsum parser on arbitrary bytes. The bounded
// random-input loop of tests/test_fuzz.cpp (make test) and the libFuzzer entry points in
// tests/fuzz/ (make fuzz) both call them.
//
// The contract under test: bad input throws tg::Error, and only that. So each target catches
// tg::Error around the call under test and nothing else; any other exception, a crash, a hang
// or a sanitizer report is a bug, and so is a result that breaks the checks below (they throw
// fuzz::Failure, which the test loop reports with the input and libFuzzer saves as a crash).
//
// Values are read only on the interpreter: the caller sets TG_DEVICE=INTERP (fuzz::init), so
// that thousands of inputs compile nothing.
#pragma once
#include "../tinygrad.hpp"
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fuzz {

// Reading values costs time per element; a fuzz input should cost microseconds.
constexpr int64_t READ_LIMIT = 4096;
// The naive einsum below visits every combination of labels.
constexpr int64_t EINSUM_WORK_LIMIT = 16384;

struct Failure : std::logic_error {
    using std::logic_error::logic_error;
};

inline void init() { setenv("TG_DEVICE", "INTERP", 1); }

// Bytes as a C string literal body, so that a failing input can be pasted into a test.
inline std::string escape(const uint8_t* data, size_t size) {
    std::string out;
    for (size_t i = 0; i < size; i++) {
        uint8_t c = data[i];
        char buf[8];
        if (c == '"' || c == '\\') out += {'\\', char(c)};
        else if (c == '\n') out += "\\n";
        else if (c >= 0x20 && c < 0x7f) out += char(c);
        else {
            // a hex escape swallows every hex digit after it: close the literal in between
            bool hex_next = i + 1 < size && std::isxdigit(data[i + 1]);
            std::snprintf(buf, sizeof buf, hex_next ? "\\x%02x\"\"" : "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

// The element count, INT64_MAX when it does not fit.
inline int64_t count_elements(const tg::Shape& shape) {
    if (std::count(shape.begin(), shape.end(), 0)) return 0;
    int64_t n = 1;
    for (int64_t d : shape)
        if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
    return n;
}

inline bool same_value(double got, double want) {
    return std::isnan(want) ? std::isnan(got) : got == want;
}

// ---- safetensors --------------------------------------------------------------------------

// The value of element i of raw little-endian data of one dtype.
inline double raw_value(const std::string& raw, tg::DType dt, size_t i) {
    size_t size = tg::dtype_size(dt);
    unsigned char b[8] = {};
    std::memcpy(b, raw.data() + i * size, size);
    uint64_t bits = 0;
    for (size_t k = size; k-- > 0;) bits = (bits << 8) | b[k];
    uint32_t low = uint32_t(bits);
    float f;
    double d;
    std::memcpy(&f, &low, 4);
    std::memcpy(&d, &bits, 8);
    switch (dt) {
    case tg::DType::FLOAT32: return f;
    case tg::DType::FLOAT64: return d;
    case tg::DType::INT32: return double(int32_t(low));
    case tg::DType::INT64: return double(int64_t(bits));
    default: return double(bits);   // BOOL: the byte as it is
    }
}

}  // namespace fuzz

// Returns 1 when the bytes loaded, 0 when the loader rejected them with tg::Error.
inline int fuzz_safetensors(const uint8_t* data, size_t size) {
    std::string file(reinterpret_cast<const char*>(data), size);
    std::map<std::string, tg::Tensor> tensors;
    try {
        tensors = tg::safetensors::load_bytes(file, "fuzz");
    } catch (const tg::Error&) {
        return 0;
    }
    // A loaded file is well formed, so its header length can be trusted from here on.
    uint64_t header = 0;
    for (int b = 7; b >= 0; b--) header = (header << 8) | uint8_t(file[size_t(b)]);
    std::string section = file.substr(8 + size_t(header));
    // the loader promises that the tensors cover the data section exactly
    int64_t covered = 0;
    for (auto& [name, t] : tensors) {
        int64_t numel = fuzz::count_elements(t.shape());
        if (t.numel() != numel)
            throw fuzz::Failure("safetensors: '" + name + "' of shape " +
                                tg::shape_str(t.shape()) + " has numel " +
                                std::to_string(t.numel()));
        int64_t bytes = 0;
        if (__builtin_mul_overflow(numel, int64_t(tg::dtype_size(t.dtype())), &bytes) ||
            __builtin_add_overflow(covered, bytes, &covered))
            throw fuzz::Failure("safetensors: '" + name + "' holds more than 2^63 bytes");
        if (numel > fuzz::READ_LIMIT) continue;
        std::vector<double> values = t.to_vector<double>();
        if (int64_t(values.size()) != numel)
            throw fuzz::Failure("safetensors: '" + name + "' read " +
                                std::to_string(values.size()) + " values of " +
                                std::to_string(numel));
        (void)t.to_string();   // printing handles any value: NaN, denormals, int64 extremes
        // With one tensor its data is the whole section, so the values can be checked too.
        if (tensors.size() != 1) continue;
        for (size_t i = 0; i < values.size(); i++) {
            double want = fuzz::raw_value(section, t.dtype(), i);
            if (!fuzz::same_value(values[i], want)) {   // (a bool byte beyond 1 is refused)
                throw fuzz::Failure("safetensors: '" + name + "' element " + std::to_string(i) +
                                    " reads " + std::to_string(values[i]) + ", the file has " +
                                    std::to_string(want));
            }
        }
    }
    if (covered != int64_t(section.size()))
        throw fuzz::Failure("safetensors: tensors hold " + std::to_string(covered) +
                            " bytes of a " + std::to_string(section.size()) + "-byte section");
    return 1;
}

// ---- einsum ---------------------------------------------------------------------------------

namespace fuzz {

// The input format. The first line is the spec. Without a newline the spec alone chooses the
// operands, so that mutating the spec keeps reaching the evaluation: one per term (at most 8),
// each letter an axis of a size of its own, "..." 0-2 axes (at most 8 axes in all). After a
// newline, bytes choose them, so that shapes that contradict the spec are tried too: byte 0 is
// the operand count (mod 5); per operand a flags byte (rank: bits 0-2 mod 7; a constant,
// Tensor::ones: bit 3; dtype: bits 4-5, F32 F64 I32 BOOL), then one byte per size (mod 5).
// Missing bytes read 0 or, for sizes, 1. tests/fuzz/make_corpus.py writes such inputs.
struct Operand {
    tg::Shape shape;
    tg::DType dtype = tg::DType::FLOAT32;
    bool constant = false;
};

inline int64_t letter_size(char c) { return c % 4 + 1; }   // i: 2, j: 3, k: 4, l: 1

// Letters past this many in a term get no axis, so the operand's rank is wrong and einsum
// refuses it: the operands stay small (up to 4^8 elements) however long the spec.
constexpr size_t SPEC_MAX_RANK = 8;

inline std::vector<Operand> operands_from_spec(const std::string& spec) {
    std::vector<Operand> ops(1);
    size_t arrow = spec.find("->");
    std::string lhs = spec.substr(0, arrow);
    for (size_t i = 0; i < lhs.size(); i++) {
        char c = lhs[i];
        if (c == ',') {
            if (ops.size() == 8) break;
            ops.emplace_back();
        } else if (lhs.compare(i, 3, "...") == 0) {
            // operand 0 gets [3], 1 [2,3], 2 [], 3 [3], ...: right-aligned, they broadcast
            size_t rank = ops.size() % 3;
            for (size_t r = 2 - rank; r < 2; r++)
                if (ops.back().shape.size() < SPEC_MAX_RANK)
                    ops.back().shape.push_back(int64_t(r + 2));
            i += 2;
        } else if (std::isalpha((unsigned char)c) && ops.back().shape.size() < SPEC_MAX_RANK) {
            ops.back().shape.push_back(letter_size(c));
        }
    }
    return ops;
}

inline std::vector<Operand> operands_from_bytes(const uint8_t* p, const uint8_t* end) {
    auto next = [&](uint8_t missing) { return p < end ? *p++ : missing; };
    std::vector<Operand> ops(next(0) % 5);
    static const tg::DType dtypes[] = {tg::DType::FLOAT32, tg::DType::FLOAT64, tg::DType::INT32,
                                       tg::DType::BOOL};
    for (Operand& op : ops) {
        uint8_t flags = next(0);
        op.dtype = dtypes[(flags >> 4) & 3];
        op.constant = flags & 8;
        for (int r = 0; r < (flags & 7) % 7; r++) op.shape.push_back(next(1) % 5);
    }
    return ops;
}

// Small integers, so that every sum of products is exact in float32.
inline double operand_value(size_t op, int64_t k, tg::DType dt) {
    if (dt == tg::DType::BOOL) return (k + int64_t(op)) % 3 != 0;
    return double((k * 7 + int64_t(op) * 3) % 5 - 2);
}

// A constant (all ones) holds no values here; nor in the library, so any size is cheap.
inline tg::Tensor make_operand(Operand& op, size_t which, std::vector<double>& values) {
    op.constant = op.constant || count_elements(op.shape) > READ_LIMIT;
    if (op.constant) return tg::Tensor::ones(op.shape, op.dtype);
    values.resize(size_t(count_elements(op.shape)));
    for (size_t k = 0; k < values.size(); k++)
        values[k] = operand_value(which, int64_t(k), op.dtype);
    if (op.dtype == tg::DType::FLOAT32)
        return tg::Tensor::from_vector(std::vector<float>(values.begin(), values.end()), op.shape);
    if (op.dtype == tg::DType::FLOAT64) return tg::Tensor::from_vector(values, op.shape);
    tg::Tensor t = tg::Tensor::from_vector(std::vector<int32_t>(values.begin(), values.end()),
                                           op.shape);
    return op.dtype == tg::DType::BOOL ? t.cast(tg::DType::BOOL) : t;
}

// What einsum must do, by the rules of its comment in tinygrad.hpp, written independently:
// letters are labels; '...' stands for axes right-aligned across operands; a letter repeated in
// one operand takes the diagonal (one size); across operands a size of 1 broadcasts; the
// implicit output is the '...' axes then the letters written once, in ASCII order.
struct EinsumPlan {
    std::string error;                   // why the spec does not fit the shapes; empty if it does
    std::vector<std::vector<int>> axes;  // the label of each axis of each operand
    std::vector<int> out;                // the output's labels
    std::vector<int> all;                // the output's, then the summed ones
    std::map<int, int64_t> size;
};

constexpr int ELLIPSIS = 100;   // the '...' axes are labels 100, 101, ...; letters 0-51

inline bool parse_term(const std::string& term, std::vector<int>& labels) {
    for (size_t i = 0; i < term.size(); i++) {
        char c = term[i];
        if (c >= 'A' && c <= 'Z') labels.push_back(c - 'A');
        else if (c >= 'a' && c <= 'z') labels.push_back(26 + c - 'a');
        else if (term.compare(i, 3, "...") == 0 && !std::count(labels.begin(), labels.end(), -1)) {
            labels.push_back(-1);
            i += 2;
        } else return false;
    }
    return true;
}

inline EinsumPlan plan_einsum(const std::string& spec_in, const std::vector<tg::Shape>& shapes) {
    EinsumPlan p;
    auto reject = [&](const std::string& why) { p.error = why; return p; };
    std::string spec;
    for (char c : spec_in)
        if (!std::isspace((unsigned char)c)) spec += c;
    size_t arrow = spec.find("->");
    std::string lhs = spec.substr(0, arrow);
    std::vector<std::vector<int>> terms;
    for (size_t start = 0;;) {
        size_t comma = lhs.find(',', start);
        terms.emplace_back();
        if (!parse_term(lhs.substr(start, comma - start), terms.back()))
            return reject("bad term");
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    if (terms.size() != shapes.size()) return reject("term count");
    size_t ell_rank = 0;
    for (size_t i = 0; i < terms.size(); i++) {
        size_t named = size_t(std::count_if(terms[i].begin(), terms[i].end(),
                                            [](int l) { return l >= 0; }));
        bool has_ellipsis = named != terms[i].size();
        if (has_ellipsis ? shapes[i].size() < named : shapes[i].size() != named)
            return reject("rank");
        if (has_ellipsis) ell_rank = std::max(ell_rank, shapes[i].size() - named);
    }
    std::map<int, int> written;   // letter → times written in the inputs
    for (auto& term : terms)
        for (int l : term)
            if (l >= 0) written[l]++;
    for (size_t i = 0; i < terms.size(); i++) {
        std::vector<int> labels;
        size_t mine = shapes[i].size() - size_t(std::count_if(
            terms[i].begin(), terms[i].end(), [](int l) { return l >= 0; }));
        for (int l : terms[i]) {
            if (l >= 0) labels.push_back(l);
            else
                for (size_t j = 0; j < mine; j++)
                    labels.push_back(ELLIPSIS + int(ell_rank - mine + j));
        }
        std::map<int, int64_t> here;
        for (size_t d = 0; d < labels.size(); d++) {
            auto it = here.find(labels[d]);
            if (it != here.end() && it->second != shapes[i][d]) return reject("diagonal sizes");
            here[labels[d]] = shapes[i][d];
        }
        for (auto [l, s] : here) {
            auto it = p.size.find(l);
            if (it == p.size.end() || it->second == 1) p.size[l] = s;
            else if (s != 1 && s != it->second) return reject("sizes");
        }
        p.axes.push_back(labels);
    }
    if (arrow != std::string::npos) {
        std::vector<int> labels;
        if (!parse_term(spec.substr(arrow + 2), labels)) return reject("bad output");
        for (int l : labels) {
            if (l == -1) {
                for (size_t j = 0; j < ell_rank; j++) p.out.push_back(ELLIPSIS + int(j));
            } else {
                if (!p.size.count(l) || std::count(p.out.begin(), p.out.end(), l))
                    return reject("output letter");
                p.out.push_back(l);
            }
        }
    } else {
        for (size_t j = 0; j < ell_rank; j++) p.out.push_back(ELLIPSIS + int(j));
        for (auto [l, n] : written)
            if (n == 1) p.out.push_back(l);
    }
    p.all = p.out;
    for (auto& [l, s] : p.size)
        if (!std::count(p.out.begin(), p.out.end(), l)) p.all.push_back(l);
    return p;
}

// The product of the label sizes, each at least 1: the work of the naive einsum.
inline int64_t plan_work(const EinsumPlan& p) {
    int64_t n = 1;
    for (auto& [l, s] : p.size)
        if (__builtin_mul_overflow(n, std::max<int64_t>(s, 1), &n)) return INT64_MAX;
    return n;
}

// Every combination of label values, each adding one product of operand elements.
inline std::vector<double> naive_einsum(const EinsumPlan& p, const std::vector<Operand>& ops,
                                        const std::vector<std::vector<double>>& values) {
    std::map<int, size_t> position;
    for (size_t k = 0; k < p.all.size(); k++) position[p.all[k]] = k;
    int64_t out_numel = 1, all_numel = 1;
    for (size_t k = 0; k < p.all.size(); k++) {
        if (k < p.out.size()) out_numel *= p.size.at(p.all[k]);
        all_numel *= p.size.at(p.all[k]);
    }
    std::vector<double> out(size_t(out_numel), 0);
    if (all_numel == 0) return out;
    std::vector<int64_t> at(p.all.size(), 0);
    while (true) {
        double product = 1;
        for (size_t i = 0; i < ops.size(); i++) {
            if (ops[i].constant) continue;
            int64_t offset = 0;
            for (size_t d = 0; d < ops[i].shape.size(); d++) {
                int64_t s = ops[i].shape[d];   // a size-1 axis broadcasts: always index 0
                offset = offset * s + (s == 1 ? 0 : at[position.at(p.axes[i][d])]);
            }
            product *= values[i][size_t(offset)];
        }
        int64_t o = 0;
        for (size_t k = 0; k < p.out.size(); k++) o = o * p.size.at(p.out[k]) + at[k];
        out[size_t(o)] += product;
        size_t k = p.all.size();   // the next combination, last label fastest
        while (k > 0 && ++at[k - 1] == p.size.at(p.all[k - 1])) at[--k] = 0;
        if (k == 0) return out;
    }
}

}  // namespace fuzz

// Returns 1 when einsum accepted the spec and operands, 0 when it threw tg::Error.
inline int fuzz_einsum(const uint8_t* data, size_t size) {
    const uint8_t* newline = static_cast<const uint8_t*>(std::memchr(data, '\n', size));
    std::string spec(reinterpret_cast<const char*>(data), newline ? size_t(newline - data) : size);
    std::vector<fuzz::Operand> ops = newline ? fuzz::operands_from_bytes(newline + 1, data + size)
                                             : fuzz::operands_from_spec(spec);
    std::vector<tg::Tensor> tensors;
    std::vector<std::vector<double>> values(ops.size());
    std::vector<tg::Shape> shapes;
    bool any_float = false, all_bool = true;
    try {   // a spec of many letters implies shapes past 2^63 elements
        for (size_t i = 0; i < ops.size(); i++)
            tensors.push_back(fuzz::make_operand(ops[i], i, values[i]));
    } catch (const tg::Error&) {
        return 0;
    }
    for (const fuzz::Operand& op : ops) {
        shapes.push_back(op.shape);
        any_float = any_float || tg::dtype_is_float(op.dtype);
        all_bool = all_bool && op.dtype == tg::DType::BOOL;
    }
    fuzz::EinsumPlan plan = fuzz::plan_einsum(spec, shapes);
    int64_t work = plan.error.empty() ? fuzz::plan_work(plan) : 0;
    auto failure = [&](const std::string& what) {
        return fuzz::Failure("einsum '" + spec + "': " + what);
    };
    tg::Tensor result;
    try {
        result = tg::einsum(spec, tensors);
    } catch (const tg::Error& e) {
        // a large product of sizes may be refused, anything smaller must work
        if (plan.error.empty() && work <= (int64_t(1) << 40))
            throw failure(std::string("rejected a valid spec: ") + e.what());
        return 0;
    }
    if (!plan.error.empty()) throw failure("accepted, but expected an error: " + plan.error);
    tg::Shape want_shape;
    for (int l : plan.out) want_shape.push_back(plan.size.at(l));
    if (result.shape() != want_shape)
        throw failure("shape " + tg::shape_str(result.shape()) + ", expected " +
                      tg::shape_str(want_shape));
    if (result.numel() != fuzz::count_elements(result.shape()))
        throw failure("numel " + std::to_string(result.numel()));
    if (tg::dtype_is_float(result.dtype()) != any_float)
        throw failure(std::string("dtype ") + tg::dtype_name(result.dtype()));
    if (work > fuzz::EINSUM_WORK_LIMIT || result.numel() > fuzz::READ_LIMIT) return 1;
    std::vector<double> got = result.to_vector<double>();
    std::vector<double> want = fuzz::naive_einsum(plan, ops, values);
    if (got.size() != want.size()) throw failure("read " + std::to_string(got.size()) + " values");
    for (size_t k = 0; k < got.size(); k++) {
        // bools multiply as 'and' and sum as 'or', as in NumPy
        double expect = all_bool ? double(want[k] != 0) : want[k];
        if (got[k] != expect)
            throw failure("element " + std::to_string(k) + " is " + std::to_string(got[k]) +
                          ", expected " + std::to_string(expect));
    }
    return 1;
}
