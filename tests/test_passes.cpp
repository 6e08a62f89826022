// The loop passes one by one (TG_PASSES selects them): what each does to a program's nests,
// and that the result computes what the unoptimized IR computes.
#include "harness.hpp"
using tg::Tensor;

namespace {
// nests after the passes named (TG_PASSES syntax)
std::string optimized(const std::vector<Tensor>& ts, const char* passes) {
    th::EnvGuard env("TG_PASSES", passes);
    return tg::inspect(ts).optimized_ir;
}
int nests(const std::string& ir) { return th::count_of("\n" + ir, "\nK"); }
Tensor data(tg::Shape s, int salt = 0) {
    size_t n = 1;
    for (int64_t d : s) n *= size_t(d);
    std::vector<float> v(n);
    for (size_t i = 0; i < v.size(); i++) v[i] = float((i + size_t(salt)) % 7) / 4 - 0.75f;
    return Tensor::from_vector(v, s);
}
// the values of ts computed with the passes named, one vector per tensor
std::vector<std::vector<float>> values(std::vector<Tensor> ts, const char* passes) {
    th::EnvGuard env("TG_PASSES", passes);
    std::vector<Tensor> copies;
    for (Tensor& t : ts) copies.push_back(t * 1.0f);   // fresh nodes: realized under passes
    tg::realize(copies);
    std::vector<std::vector<float>> out;
    for (Tensor& t : copies) out.push_back(t.to_vector());
    return out;
}
void check_same_values(const std::vector<Tensor>& ts) {
    auto none = values(ts, "none"), all = values(ts, "all");
    for (size_t i = 0; i < ts.size(); i++) {
        std::vector<double> want(none[i].begin(), none[i].end());
        CHECK_ALL_NEAR(all[i], want, 1e-6);
    }
}
}  // namespace

TEST(passes_none_runs_the_ir_as_lowered) {
    Tensor x = data({4, 10});
    th::EnvGuard env("TG_PASSES", "none");
    tg::Stages st = tg::inspect({x.exp(), x * 2.0f});
    CHECK_EQ(st.optimized_ir, st.loop_ir);
    CHECK(st.loop_ir.find("/ ") != std::string::npos || st.loop_ir.find("0 + ") != std::string::npos);
}

TEST(passes_unknown_name_is_an_error) {
    Tensor x = data({4});
    th::EnvGuard env("TG_PASSES", "simplify,fuse_everything");
    CHECK_THROWS(tg::inspect({x.exp()}), "TG_PASSES: unknown pass 'fuse_everything'",
                 "fuse_loops");
}

// fuse_maps (the GPU's: only maps whose every loop fuses): a value a map computes before an
// inner loop (a layer norm's reciprocal per row) goes into that loop, so the normalize and the
// scale after it become one nest.
TEST(fuse_maps_sinks_values_before_inner_loops) {
    Tensor x = data({4, 16, 300}), w = data({300}, 1), b = data({300}, 2);
    Tensor deviation = data({4, 16, 1}, 3) + 2.0f;
    Tensor normalized = x * deviation.reciprocal();
    std::vector<Tensor> ts = {normalized, normalized * w + b};
    std::string apart = optimized(ts, "simplify");
    CHECK_EQ(nests(apart), 2);
    CHECK(apart.find("      acc0 = recip(") != std::string::npos);   // before the row's loop
    std::string ir = optimized(ts, "simplify,fuse_maps");
    CHECK_EQ(nests(ir), 1);
    CHECK(ir.find("RECIP MUL + K") != std::string::npos);
}

// fuse_maps joins nests over the same rows where the GPU runs the result as rows (a warp or
// a block per row): a layer norm's statistics and normalization, a softmax's maximum,
// exponentials and sum, are each one nest. Not where a row would read another row's result
// (the sums flipped), nor into a product's nest (the GPU tiles it), nor with few rows.
TEST(fuse_maps_joins_nests_over_the_same_rows) {
    Tensor x = data({16, 64, 128}), w = data({128}, 1), b = data({128}, 2);
    // the statistics are outputs too (a backward reads them), so they are nests of their own
    Tensor mean = x.mean(-1, true), centred = x - mean;
    Tensor rstd = (centred.square().mean(-1, true) + 1e-5f).rsqrt();
    std::vector<Tensor> layer_norm = {centred * rstd * w + b, mean, rstd};
    CHECK_EQ(nests(optimized(layer_norm, "simplify")), 3);
    std::string ir = optimized(layer_norm, "simplify,fuse_maps");
    CHECK_EQ(nests(ir), 1);
    CHECK_EQ(th::count_of(ir, "for i1 < 64:"), 1);
    std::vector<Tensor> softmax = {x.max(-1, true), x.softmax(-1)};
    CHECK(nests(optimized(softmax, "simplify")) >= 2);
    CHECK_EQ(nests(optimized(softmax, "simplify,fuse_maps")), 1);

    Tensor sums = x.sum(-1, true);
    auto spread = [&](const Tensor& s) { return (x - s).square().sum(-1); };
    CHECK_EQ(nests(optimized({sums, spread(sums)}, "simplify,fuse_maps")), 1);
    CHECK_EQ(nests(optimized({sums, spread(sums.flip(0))}, "simplify")), 2);
    CHECK_EQ(nests(optimized({sums, spread(sums.flip(0))}, "simplify,fuse_maps")), 2);
    Tensor product = x.matmul(data({128, 128}, 3));
    std::string after_product = optimized({product - product.mean(-1, true)},
                                          "simplify,fuse_maps");
    CHECK_EQ(nests(after_product), 2);
    CHECK(after_product.find("[16,64,1,128]: MUL REDUCE_SUM ") != std::string::npos);
    Tensor few = data({4, 64, 128});   // 256 rows
    std::vector<Tensor> few_softmax = {few.max(-1, true), few.softmax(-1)};
    CHECK_EQ(nests(optimized(few_softmax, "simplify,fuse_maps")),
             nests(optimized(few_softmax, "simplify")));
}

// Two nests over the same rows become one; the loops inside fuse too, so a value stored and
// read back at the same index is read from a local.
TEST(fuse_loops_merges_nests_with_equal_extents) {
    Tensor x = data({4, 10});
    std::vector<Tensor> ts = {x + 1.0f, x * 2.0f};
    CHECK_EQ(nests(optimized(ts, "simplify")), 2);
    std::string ir = optimized(ts, "simplify,fuse_loops");
    CHECK_EQ(nests(ir), 1);
    CHECK_EQ(th::count_of(ir, "for i1 < 10"), 1);   // the inner loops fused as well
    CHECK(ir.find(" + K1 ") != std::string::npos);   // the title names both kernels
    check_same_values(ts);
}

// merge-left: the third nest moves past an independent second to join the first; merge-right:
// when the third reads what the second writes, the first moves right instead.
TEST(fuse_loops_steps_over_a_nest_in_between) {
    Tensor x = data({4, 10}), other = data({8});
    std::vector<Tensor> left = {x + 1.0f, other.exp(), x * 2.0f};
    std::string ir = optimized(left, "simplify,fuse_loops");
    CHECK_EQ(nests(ir), 2);
    CHECK(ir.find("K0 forward float32 [4,10]: ADD + K2") != std::string::npos);
    check_same_values(left);

    Tensor doubled = x * 2.0f, b = other.exp();
    Tensor reads_b = x + b.reshape({4, 2}).sum(1, true);   // reads b: cannot move left
    std::vector<Tensor> right = {doubled, b, reads_b};
    std::string r = optimized(right, "simplify,fuse_loops");
    CHECK_EQ(nests(r), 2);
    CHECK(r.find("K1 forward float32 [8]") < r.find("K0 forward float32 [4,10]: MUL + K2"));
    check_same_values(right);
}

// A nest that reads another's output at other rows (a flip) must not fuse with it.
TEST(fuse_loops_keeps_dependences_across_rows) {
    Tensor x = data({4, 10});
    Tensor y = x + 1.0f;
    std::vector<Tensor> ts = {y, y.flip(0) * 2.0f};
    CHECK_EQ(nests(optimized(ts, "all")), 2);
    check_same_values(ts);
    // a row reduction of the first nest's output reads only its own row: fuses
    std::vector<Tensor> rows = {y, y.sum(1)};
    CHECK_EQ(nests(optimized(rows, "simplify,fuse_loops")), 1);
    check_same_values(rows);
    // the inner loops of a matrix product and of an elementwise op over the same rows fuse
    // too, but not when the elementwise op computes exp: GCC vectorizes such a loop worse
    // together with a reduction loop than apart
    Tensor w = data({10, 10}, 3);
    std::vector<Tensor> product_and_double = {x.matmul(w), x * 2.0f};
    std::string fused = optimized(product_and_double, "simplify,fuse_loops");
    CHECK_EQ(nests(fused), 1);
    CHECK_EQ(th::count_of(fused, "for "), 3);   // rows, columns, the product's sum
    check_same_values(product_and_double);
    std::vector<Tensor> product_and_exp = {x.matmul(w), x.exp()};
    std::string apart = optimized(product_and_exp, "simplify,fuse_loops");
    CHECK_EQ(nests(apart), 1);
    CHECK_EQ(th::count_of(apart, "for "), 4);   // the exp's column loop of its own
    check_same_values(product_and_exp);
}

// A value lowering computes once before a nest's loop (1 - e here; Adam's bias corrections)
// moves into the loop, so the nest fuses with the one beside it.
TEST(fuse_loops_sinks_loop_invariant_values_into_the_loop) {
    Tensor x = data({4, 10}), t = Tensor::full({}, 3.0f);
    t.realize();
    Tensor e = (t * 0.5f).exp2(), c = 1.0f - e;
    std::vector<Tensor> ts = {x * 2.0f, x / c, (x * x) / c, e};
    std::string apart = optimized(ts, "simplify");
    CHECK_EQ(nests(apart), 4);
    CHECK_EQ(th::count_of(apart, "  acc0 = (1 + -buf"), 2);   // before the loops
    std::string fused = optimized(ts, "simplify,fuse_loops");
    // the three nests over x as one loop, e (one value) computed before it in the same nest
    CHECK_EQ(nests(fused), 1);
    CHECK(fused.find("K1 forward float32 []") < fused.find("K0 forward float32 [4,10]: MUL + K2"));
    CHECK(fused.find("buf2[0] = exp2") < fused.find("for i0 < 4"));
    CHECK_EQ(th::count_of(fused, "acc0"), 0);
    check_same_values(ts);
}

// Nests that store only outside loops (a loss, an optimizer's step count) run one after the
// other in one nest; a bounds check stays apart from an in-place write.
TEST(fuse_loops_joins_nests_without_output_loops) {
    Tensor x = data({4, 10}), y = data({7}, 2);
    std::vector<Tensor> sums = {x.sum(), (x * 2.0f).max(), y.exp().sum()};
    CHECK_EQ(nests(optimized(sums, "simplify")), 3);
    std::string one = optimized(sums, "simplify,fuse_loops");
    CHECK_EQ(nests(one), 1);
    CHECK(one.find("REDUCE_SUM + K1 forward float32 []: MUL REDUCE_MAX + K2") != std::string::npos);
    check_same_values(sums);

    Tensor count = Tensor::full({}, 1.0f), table = data({5});
    count.realize();
    table.realize();
    Tensor idx = Tensor::from_vector(std::vector<int32_t>{4});
    std::vector<Tensor> checked = {table.gather(0, idx).sum(), count.assign(count + 1.0f)};
    CHECK_EQ(nests(optimized(checked, "simplify,fuse_loops")), 2);
}

// Once the loops have fused, a nest of one value joins a loop beside it that is too small for
// threads (an optimizer's step count joins the last update), not one that runs on threads.
TEST(fuse_loops_joins_one_value_to_a_small_loop) {
    Tensor small = data({27, 10}), big = data({300, 300}), count = Tensor::full({}, 1.0f);
    count.realize();
    std::vector<Tensor> with_small = {small * 0.5f, count + 1.0f};
    CHECK_EQ(nests(optimized(with_small, "simplify")), 2);
    std::string joined = optimized(with_small, "simplify,fuse_loops");
    CHECK_EQ(nests(joined), 1);
    CHECK(joined.find("for i0 < 27") < joined.find("buf2[0] = (buf3[0] + 1)"));
    check_same_values(with_small);
    std::vector<Tensor> with_big = {big * 0.5f, count + 1.0f};   // 90,000 iterations
    CHECK_EQ(nests(optimized(with_big, "simplify,fuse_loops")), 2);
}

TEST(substitute_temps_reads_a_stored_value_from_a_local) {
    Tensor x = data({4, 10});
    Tensor y = x * 3.0f + 1.0f;
    std::vector<Tensor> ts = {y, y * 2.0f};
    std::string before = optimized(ts, "simplify,fuse_loops");
    CHECK_EQ(th::count_of(before, "buf0[("), 2);   // stored, then loaded
    std::string after = optimized(ts, "simplify,fuse_loops,substitute_temps");
    CHECK_EQ(th::count_of(after, "buf0[("), 1);    // stored only: the product reads the local
    CHECK(after.find("acc0*2") != std::string::npos);
    check_same_values(ts);
}

// A temporary stored and read only inside the fused nest is not stored at all.
TEST(dead_stores_drop_temporaries_nobody_reads) {
    Tensor x = data({4, 10});
    Tensor t = x.reciprocal().reciprocal().reciprocal().reciprocal().reciprocal().reciprocal()
                   .reciprocal();   // costly: stored once for its two readers
    std::vector<Tensor> ts = {t + 1.0f, t * 2.0f};
    std::string kept = optimized(ts, "simplify,fuse_loops,substitute_temps");
    CHECK(kept.find("buf0: temp") != std::string::npos);
    CHECK_EQ(th::count_of(kept, "buf0[("), 1);
    std::string dropped = optimized(ts, "simplify,fuse_loops,substitute_temps,dead_stores");
    CHECK_EQ(th::count_of(dropped, "buf0[("), 0);
    CHECK_EQ(nests(dropped), 1);
    check_same_values(ts);
}

// A sum of one or two terms starts from its first term; longer ones and empty sums stay.
TEST(first_write_starts_short_accumulations_at_their_first_term) {
    Tensor two = data({3, 2}), x = data({3, 5});
    std::string before = optimized({two.sum(1)}, "simplify");
    CHECK(before.find("acc0 = 0\n") != std::string::npos);
    std::string ir = optimized({two.sum(1)}, "simplify,first_write");
    CHECK(ir.find("acc0 = buf1[i0*2]\n") != std::string::npos);
    CHECK(ir.find("acc0 += buf1[(i0*2 + 1)]") != std::string::npos);
    CHECK(ir.find("acc0 = 0") == std::string::npos);
    std::string five = optimized({x.sum(1)}, "simplify,first_write");
    CHECK(five.find("acc0 = 0\n") != std::string::npos);   // a loop of 5 keeps its zero start
    std::vector<Tensor> ts = {x.sum(1), x.max(1), data({3, 1}).sum(1), data({3, 2}).sum(1),
                              data({3, 2}).max(1), x.sum(0)};
    check_same_values(ts);
    Tensor empty = Tensor::zeros({3, 0});
    th::EnvGuard env("TG_PASSES", "all");
    CHECK_ALL_NEAR((empty.sum(1) + 1.0f).to_vector(), (std::vector<double>{1, 1, 1}), 0);
}

TEST(simplify_drops_loops_of_one_iteration) {
    Tensor x = data({4, 30});   // 30 = one block of 16 terms + a tail of 14: one block loop
    std::string before = optimized({x.sum(1)}, "none");
    CHECK(before.find("< 1:") != std::string::npos);
    std::string after = optimized({x.sum(1)}, "simplify");
    CHECK(after.find("< 1:") == std::string::npos);
    check_same_values({x.sum(1)});
}

// A pad clamps its source index (i < 32 ? 0 : i - 32); on the side where the select reads the
// source, i >= 32, so the index splits into the source's axes without dividing by the row.
TEST(simplify_splits_a_padded_index_by_the_range_its_select_allows) {
    Tensor x = data({4, 32, 2});
    Tensor y = x.permute({0, 2, 1}).reshape({4, 64}).pad({{0, 0}, {32, 0}});
    std::string ir = optimized({y}, "simplify");
    CHECK(ir.find("buf1[(i0*64 + ") != std::string::npos);
    CHECK(ir.find("/ 64") == std::string::npos);
    CHECK(ir.find("% 64") == std::string::npos);
    check_same_values({y});
}

// Rows of 64 read as rows of 32 through a permute: (i·32 + j) / 64 is i / 2 and
// (i·32 + j) % 64 is (i % 2)·32 + j, as j < 32, so no index divides by 64.
TEST(simplify_divides_an_index_by_the_factor_its_terms_share) {
    Tensor x = data({2, 4, 64});
    Tensor y = x.permute({1, 0, 2}).reshape({4, 4, 32}) * 2.0f;
    std::string ir = optimized({y}, "simplify");
    CHECK(ir.find("(i1 / 2)*256 + (i1 % 2)*32") != std::string::npos);
    CHECK(ir.find("/ 64") == std::string::npos);
    CHECK(ir.find("% 64") == std::string::npos);
    check_same_values({y});
}

// A padded row upsampled by 2 reads its pad where i / 2 < 1, which simplify compares as
// i < 2: the select's other side knows i >= 2, and split_at_edges splits the loop there.
TEST(simplify_compares_the_variable_of_a_divided_index) {
    Tensor p = data({4, 15}).pad({{0, 0}, {1, 0}});
    Tensor up = p.reshape({4, 16, 1}).expand({4, 16, 2}).reshape({4, 32}) * 2.0f;
    std::string ir = optimized({up}, "simplify");
    CHECK(ir.find("t0 = (i1 < 2)") != std::string::npos);
    std::string split = optimized({up}, "simplify,split_at_edges");
    CHECK(split.find("for i3 < 30:") != std::string::npos);
    CHECK(split.find("buf1[(i0*15 + (i3 / 2))]") != std::string::npos);
    CHECK(split.find("where") == std::string::npos);
    check_same_values({up});
    Tensor odd = data({4, 5}).pad({{0, 0}, {2, 3}}).reshape({4, 10, 1}).expand({4, 10, 3});
    check_same_values({odd.reshape({4, 30}) + 1.0f, odd.reshape({40, 3}).sum(1)});
    // every third element from the pad of 2 on: 3·i < 2 is i < 1
    check_same_values({data({4, 7}).pad({{0, 0}, {2, 0}}).slice(1, 0, 9, 3) + 1.0f});
}

// A maximum that simplify proves unused loses its accumulator, but its gather's bounds check
// stays (the C once kept the loop and lost the accumulator's declaration).
TEST(dead_stores_keep_the_bounds_checks_of_what_they_drop) {
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                      14, 15, 16}, {4, 4, 1});
    Tensor rows = t[Tensor::from_vector(std::vector<int32_t>{3, 0, 2, 1})];
    Tensor m = rows.max(1, true).pad({{1, 0}, {1, 2}, {1, 2}}, 0.0f);
    Tensor out = m.min(std::vector<int>{-1, 0}, false).slice(0, 2, -1, 2);
    CHECK_ALL_NEAR(out.to_vector(), (std::vector<double>{0}), 0);
    Tensor bad = t[Tensor::from_vector(std::vector<int32_t>{3, 0, 9, 1})];
    Tensor m2 = bad.max(1, true).pad({{1, 0}, {1, 2}, {1, 2}}, 0.0f);
    CHECK_THROWS(m2.min(std::vector<int>{-1, 0}, false).slice(0, 2, -1, 2).to_vector(),
                 "index out of range");
}

// Temporaries whose lifetimes do not overlap share arena bytes; inputs and outputs stay out of
// it; the results are those of the unplanned program.
// A temporary read at another index than it was written (a flip), inside the row loop that
// writes it, becomes an array of that loop: a row on the stack instead of a buffer in memory.
TEST(local_temps_keep_a_row_in_an_array_of_its_loop) {
    Tensor x = data({4, 10});
    Tensor y = (x + 2.0f).reciprocal().reciprocal().reciprocal().reciprocal().reciprocal()
                   .reciprocal().reciprocal();   // costly: stored once for its two readers
    std::vector<Tensor> ts = {(y * y.flip(1)).sum(1)};
    std::string before = optimized(ts, "simplify,fuse_loops");
    CHECK_EQ(nests(before), 1);
    CHECK(before.find("buf0: temp float32[40]\n") != std::string::npos);
    CHECK(before.find("buf0[(i0*10 + i1)]") != std::string::npos);
    std::string after = optimized(ts, "simplify,fuse_loops,local_temps");
    CHECK(after.find("buf0: temp float32[10] local to loop i0 of K0") != std::string::npos);
    CHECK(after.find("buf0[i1] = ") != std::string::npos);
    CHECK(after.find("buf0[(i2*-1 + 9)]") != std::string::npos);
    std::string c = tg::inspect(ts).c_source;
    CHECK(c.find("        float buf0[10];\n") != std::string::npos);
    check_same_values(ts);
    // read by two nests, it stays a temporary in memory
    std::vector<Tensor> two = {(y * y.flip(1)).sum(1), y.flip(0)};
    CHECK(optimized(two, "all").find("local to") == std::string::npos);
    check_same_values(two);
}

// Two stored values, each read by two sums: as lowered, the sums of a and b alternate, so both
// live together; ordered, a's second sum runs before b exists and b takes a's place.
TEST(order_nests_ends_temporaries_early) {
    Tensor x = data({1000}), y = data({1000}, 3);
    Tensor a = x.exp(), b = y.exp();
    std::vector<Tensor> ts = {(a * 2.0f).sum(), (b * 2.0f).sum(), (a * 3.0f).sum(),
                              (b * 3.0f).sum()};
    auto arena = [&](const char* passes) {
        values(ts, passes);
        return tg::last_program().arena_bytes;
    };
    CHECK_EQ(arena("simplify,plan_memory"), int64_t(4032 + 4000));   // 64-byte aligned
    CHECK_EQ(arena("simplify,order_nests,plan_memory"), int64_t(4000));
    std::string ir = optimized(ts, "simplify,order_nests");
    // a's second sum (K4) runs before b (K2) exists
    CHECK(ir.find("K4 forward float32 []") < ir.find("K2 forward float32 [1000]"));
    auto none = values(ts, "none"), ordered = values(ts, "simplify,order_nests,plan_memory");
    CHECK(none == ordered);   // the same arithmetic in another order: the same bits
}

// An in-place write that frees nothing would go first; it stays after the bounds check, so a
// bad index still leaves the counter as it was.
TEST(order_nests_keeps_in_place_writes_after_bounds_checks) {
    Tensor table = data({5}), count = Tensor::full({}, 1.0f);
    count.realize();
    Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 9});   // 9 is out of range
    Tensor picked = table.gather(0, ids).exp();                    // stored: two readers
    std::vector<Tensor> ts = {(picked * 2.0f).sum(), (picked * 3.0f).sum(),
                              count.assign(count + 1.0f)};
    std::string ir = optimized(ts, "simplify,order_nests");
    CHECK(ir.find("GATHER") < ir.find("ASSIGN"));
    CHECK_THROWS(tg::realize(ts), "out of range", "got 9");
    CHECK_EQ(count.to_vector(), std::vector<float>{1});
}

TEST(plan_memory_shares_the_arena_by_lifetime) {
    Tensor x = data({64, 64});
    // three costly values, each read by two kernels: stored, and each dead once the next
    // two kernels have read it
    auto costly = [](const Tensor& t) {
        return t.reciprocal().reciprocal().reciprocal().reciprocal().reciprocal().reciprocal()
            .reciprocal();
    };
    Tensor t1 = costly(x), a = t1.sum(0) + t1.sum(1);
    Tensor t2 = costly(a.reshape({1, 64}) + x), b = t2.sum(0) + t2.sum(1);
    Tensor t3 = costly(b.reshape({64, 1}) + x), c = t3.sum(0) + t3.sum(1);
    std::string ir = optimized({c}, "all");
    CHECK(ir.find("at arena+0") != std::string::npos);
    CHECK(ir.find("input float32[4096] at arena") == std::string::npos);
    CHECK(ir.find("output float32[64] at arena") == std::string::npos);
    {
        th::EnvGuard env("TG_PASSES", "all");
        (c * 1.0f).to_vector();
        tg::ProgramInfo p = tg::last_program();
        CHECK(p.temporaries >= 3);
        CHECK(p.arena_bytes > 0);
        CHECK(p.arena_bytes < p.temp_bytes);   // 3 buffers of 16 KiB, at most 2 alive at once
        CHECK(p.arena_bytes <= 2 * 64 * 64 * 4 + 64 * 4 * 4);
    }
    check_same_values({c});
}

// The schedule says why each buffer exists (TG_DEBUG=2 prints it with the program's figures).
TEST(schedule_names_the_reason_for_each_buffer) {
    Tensor x = data({8, 8});
    Tensor t = x.reciprocal().reciprocal().reciprocal().reciprocal().reciprocal().reciprocal()
                   .reciprocal();
    std::string s = tg::inspect({t.sum(0) + t.sum(1), x.contiguous()}).schedule;
    CHECK(s.find("(target)") != std::string::npos);
    CHECK(s.find("(read by 2+ kernels)") != std::string::npos ||
          s.find("costly to recompute") != std::string::npos);
    Tensor y = data({4});
    std::string a = tg::inspect({y.assign(y.flip(0))}).schedule;
    CHECK(a.find("(assign)") != std::string::npos || a.find("(target)") != std::string::npos);
    CHECK(a.find("(reads its assignment's target at other indices)") != std::string::npos);
}

// -- tile_products
namespace {
// the product of a [batch, m, k] and b [batch, k, n] (contiguous values) in float64
std::vector<double> product_f64(const std::vector<float>& a, const std::vector<float>& b,
                                size_t batch, size_t m, size_t k, size_t n) {
    std::vector<double> out(batch * m * n, 0.0);
    for (size_t z = 0; z < batch; z++)
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++) {
                double s = 0;
                for (size_t t = 0; t < k; t++)
                    s += double(a[(z * m + i) * k + t]) * double(b[(z * k + t) * n + j]);
                out[(z * m + i) * n + j] = s;
            }
    return out;
}
}  // namespace

// A matrix product becomes a tiled nest (vector sums over packed operands) that adds each
// element's terms in the order of the untiled loops: the same bits as TG_PASSES=none, on
// awkward shapes, strided and broadcast operands and batches, for any thread count.
TEST(tile_products_give_the_bits_of_the_untiled_loops) {
    struct Case { Tensor a, b; size_t batch, m, k, n; bool tiled; };
    std::vector<Case> cases = {
        {data({37, 53}), data({53, 41}, 1), 1, 37, 53, 41, true},                // primes
        {data({64, 1023}), data({1023, 65}, 2), 1, 64, 1023, 65, true},
        {data({33, 1025}), data({1025, 17}, 3), 1, 33, 1025, 17, true},
        {data({53, 37}).transpose(0, 1), data({41, 53}, 4).transpose(0, 1), 1, 37, 53, 41, true},
        {data({1, 53}).expand({37, 53}), data({53, 41}, 5), 1, 37, 53, 41, true},   // broadcast
        {data({3, 17, 33}), data({3, 33, 29}, 6), 3, 17, 33, 29, true},          // batched
        // operands computed, so packed: along the rows and columns, and across them
        {data({37, 53}) * data({37, 53}, 9), data({53, 41}, 1) * 2.0f, 1, 37, 53, 41, true},
        {data({53, 37}).transpose(0, 1) * 2.0f, data({41, 53}, 4).transpose(0, 1) + 1.0f, 1, 37,
         53, 41, true},
        // columns that step by one and jump every 8 (a slice of a wider array, reshaped)
        {data({37, 53}), data({53, 8, 9}, 10).slice(2, 0, 8).reshape({53, 64}), 1, 37, 53, 64,
         true},
        // sums too long for a panel, in pieces: runs of its levels of blocks of 16 terms
        // (5000: 4096 + 768 + 128 + 8), or a level's blocks a chunk at a time (13000: its 3 x
        // 4096 first); columns packed, read where they lie, and rows packed (random values: a
        // sum in another order has other bits)
        {Tensor::randn({19, 13000}, 1), Tensor::randn({13000, 23}, 2), 1, 19, 13000, 23, true},
        {Tensor::randn({19, 5000}, 3), Tensor::randn({5000, 32}, 4), 1, 19, 5000, 32, true},
        {Tensor::randn({19, 13000}, 5) * 2.0f, Tensor::randn({13000, 23}, 6), 1, 19, 13000, 23,
         true},
        // a level too long for chunks (3 x 65536 terms), iteration by iteration around chunks
        // of the level below
        {Tensor::randn({3, 196608}, 7), Tensor::randn({196608, 5}, 8), 1, 3, 196608, 5, true},
        {data({1, 64}), data({64, 64}, 7), 1, 1, 64, 64, false},                 // one row
        {data({4, 0}), data({0, 5}, 8), 1, 4, 0, 5, false},                      // empty sums
    };
    for (Case& c : cases) {
        Tensor y = c.a.matmul(c.b);
        std::string ir = optimized({y * 1.0f}, "all");
        CHECK_EQ(ir.find("[tiles: ") != std::string::npos, c.tiled);
        CHECK_EQ(ir.find("sums in pieces") != std::string::npos, c.k > 4096);
        std::vector<float> tiled = values({y}, "all")[0];
        CHECK(tiled == values({y}, "none")[0]);
        std::vector<double> want = product_f64((c.a * 1.0f).to_vector(), (c.b * 1.0f).to_vector(),
                                               c.batch, c.m, c.k, c.n);
        CHECK_ALL_NEAR(tiled, want, 1e-5 * double(c.k + 1));
        for (const char* threads : {"1", "3"}) {
            th::EnvGuard env("TG_THREADS", threads);
            CHECK(values({y}, "all")[0] == tiled);
        }
    }
    // two such sums in one nest, each a piece at a time (a convolution's weight gradient: one
    // for each of the kernel's positions)
    Tensor y = Tensor::randn({24, 13000}, 7).matmul(Tensor::randn({13000, 20}, 8)) +
               Tensor::randn({24, 13000}, 9).matmul(Tensor::randn({13000, 20}, 10));
    std::string ir = optimized({y * 1.0f}, "all");
    CHECK_EQ(th::count_of(ir, "[tiles: "), 1);
    CHECK(ir.find("sums in pieces") != std::string::npos);
    std::vector<float> tiled = values({y}, "all")[0];
    CHECK(tiled == values({y}, "none")[0]);
    th::EnvGuard env("TG_THREADS", "3");
    CHECK(values({y}, "all")[0] == tiled);
}

// A recurrence unrolled over its steps: each step's kernel reads its own rows of the stacked
// input (x[t], at another offset), so the steps after the first share one function; the
// weight's gradient is a sum tree per step in one tiled product, which runs them as a loop
// over tables of the steps' buffers (sibling trees), with the bits of the untiled loops.
TEST_ON_CPU(recurrent_steps_share_code_and_their_gradient_trees_run_as_a_loop) {
    // (steps, batch): a batch of 512 makes the gradient's sums too long for one panel, so
    // they run in pieces of 8 steps' trees (a loop over 8, then 3 trees as they are)
    for (auto [T, N] : {std::pair<int64_t, int64_t>{6, 16}, {12, 512}}) {
        const int64_t H = 64;
        Tensor x = Tensor::randn({T, N, H}, 1);
        Tensor w = (Tensor::randn({H, H}, 2) * 0.1f).requires_grad();
        Tensor h = Tensor::zeros({N, H});
        for (int64_t t = 0; t < T; t++) h = (x[t] + h.matmul(w)).tanh();
        Tensor g = tg::gradients((h * h).sum(), {w})[0];
        // step 0 reads no state (h is 0): steps 1 on run step 1's function, and the gradient
        // sums the products of steps 1 on
        CHECK_EQ(th::count_of(tg::inspect({h}).c_source, "runs k"), int(T) - 2);
        tg::Stages st = tg::inspect({g});
        CHECK_EQ(st.optimized_ir.find("sums in pieces") != std::string::npos, N == 512);
        const char* loop = N == 512 ? "for (int sib = 0; sib < 8; sib++) {"
                                    : "for (int sib = 0; sib < 5; sib++) {";
        CHECK(st.c_source.find(loop) != std::string::npos);
        std::vector<std::vector<float>> all = values({h, g}, "all");
        CHECK(all == values({h, g}, "none"));
        th::EnvGuard env("TG_THREADS", "3");
        CHECK(values({h, g}, "all") == all);
    }
}

// Five products of one shape summed (a weight used five times): each a tree of 6 x 16 + 4
// terms, five statements that run as a loop over the five, one array of sums for each (read
// by the epilogue) and one for the partial sums inside, which every product uses in turn.
TEST_ON_CPU(products_of_one_shape_summed_run_as_a_loop) {
    Tensor s;
    for (uint64_t k = 0; k < 5; k++) {
        Tensor p = Tensor::randn({32, 100}, 20 + 2 * k)
                       .matmul(Tensor::randn({100, 64}, 21 + 2 * k));
        s = k ? s + p : p;
    }
    std::string c = tg::inspect({s * 1.0f}).c_source;
    CHECK(c.find("for (int sib = 0; sib < 5; sib++) {") != std::string::npos);
    CHECK_EQ(th::count_of(c, "tg_vf sum0[5][4][4];"), 1);
    CHECK_EQ(th::count_of(c, "[5][4][4];"), 1);
    std::vector<std::vector<float>> all = values({s}, "all");
    CHECK(all == values({s}, "none"));
    th::EnvGuard env("TG_THREADS", "3");
    CHECK(values({s}, "all") == all);
}

// A panel of packed columns that every task of those columns reads alike (x·wᵀ, w read across
// its columns, for each of a batch's matrices) is packed once for them, not once a task: the
// tasks take the panels last (here 4 of them, the last short; 2 row blocks; 3 matrices), so a
// chunk of tasks packs each of its panels once. A y that differs from one matrix to the next
// is packed for each task. Either way, w is read across its columns but along a term loop of
// 16: 16 columns' 16 terms are copied as a block and stored transposed (the panel's last 8
// columns term by term).
TEST_ON_CPU(products_pack_a_shared_panel_once_and_copy_blocks_of_terms) {
    Tensor x = Tensor::randn({70, 3, 512}, 30).transpose(0, 1);   // 3 products, not one
    Tensor y = x.matmul(Tensor::randn({200, 512}, 31).transpose(0, 1));
    std::string c = tg::inspect({y * 1.0f}).c_source;
    CHECK_EQ(th::count_of(c, "int64_t packed_col0 = -1;"), 1);
    CHECK_EQ(th::count_of(c, "if (col0 != packed_col0) {"), 1);
    CHECK(c.find("int64_t col0 = task / 6 % 4 * 64;") != std::string::npos);
    CHECK(c.find("if (ce - cb == 16) {") != std::string::npos);
    CHECK(c.find("to[n * 32 + c] = block[c][n];") != std::string::npos);
    std::vector<std::vector<float>> all = values({y}, "all");
    CHECK(all == values({y}, "none"));
    for (const char* threads : {"2", "3"}) {
        th::EnvGuard env("TG_THREADS", threads);
        CHECK(values({y}, "all") == all);
    }
    Tensor z = x.matmul(Tensor::randn({3, 200, 512}, 32).transpose(1, 2));
    c = tg::inspect({z * 1.0f}).c_source;
    CHECK(c.find("float ys[") != std::string::npos);
    CHECK_EQ(th::count_of(c, "packed_col0"), 0);
    CHECK(c.find("= block[c][n];") != std::string::npos);
    CHECK(values({z}, "all") == values({z}, "none"));
}

// Code for the tails of panels and tiles is written only where a product has them: a
// convolution's weight gradient of 32 output channels packs its output gradient 16 columns at
// a time with no loop for a panel's last columns and zeros none past the end; one of 40 has
// both. A product whose rows are packed (x computed) zeros the rows past the end of its last
// tile of 8 only where there is one: 12 rows, not 16. The bits are the loops'.
TEST_ON_CPU(tile_products_write_tail_code_only_for_tails) {
    th::EnvGuard tile("TG_TILE_MIN_WORK", "1");
    for (auto [c_out, tails] : {std::pair<int64_t, bool>{32, false}, {40, true}}) {
        Tensor x = Tensor::randn({4, 3, 16, 16}, 44);
        Tensor w = Tensor::randn({c_out, 3, 3, 3}, 45).requires_grad();
        Tensor y = tg::nn::functional::conv2d(x, w, Tensor(), 1, 1);
        Tensor g = tg::gradients((y * y).sum(), {w})[0];
        std::string c = tg::inspect({g * 1.0f}).c_source;
        CHECK(c.find("= block[c][n];") != std::string::npos);
        CHECK_EQ(c.find("if (ce - cb == 16) {") != std::string::npos, tails);
        CHECK_EQ(c.find("if ((col_end - col0) % 16) {") != std::string::npos, tails);
        CHECK(values({g}, "all") == values({g}, "none"));
    }
    for (auto [rows, tails] : {std::pair<int64_t, bool>{16, false}, {12, true}}) {
        Tensor a = data({rows, 64}), w = data({64, 32}, 1);
        Tensor y = (a * 2.0f + 1.0f).matmul(w);
        std::string c = tg::inspect({y * 1.0f}).c_source;
        CHECK(c.find("float xs[") != std::string::npos);
        CHECK_EQ(c.find("for (int64_t r = row_end - r0; r < 8; r++)") != std::string::npos,
                 tails);
        CHECK(values({y}, "all") == values({y}, "none"));
    }
}

// The elementwise ops after a product (bias, activation; a weight's update after its
// gradient) join its nest as the epilogue of each tile: one nest, no temporary.
TEST_ON_CPU(tile_products_take_their_elementwise_consumers_along) {
    Tensor x = data({64, 96}), w = data({96, 80}, 1), b = data({80}, 2);
    Tensor y = (x.matmul(w) + b).relu();
    {
        th::EnvGuard env("TG_PASSES", "all");
        (y * 1.0f).to_vector();
        CHECK_EQ(tg::last_program().nests, 1);
        CHECK_EQ(tg::last_program().tiled_nests, 1);
        CHECK_EQ(tg::last_program().temporaries, 0);
    }
    check_same_values({y});
    CHECK(values({y}, "all")[0] == values({y}, "none")[0]);
    Tensor p = data({96, 80}, 3), g = x.transpose(0, 1).matmul(data({64, 80}, 4));
    std::vector<float> before = p.to_vector(), grad = (g * 1.0f).to_vector();
    {
        th::EnvGuard env("TG_PASSES", "all");
        p.assign(p - g * 0.5f).realize();
        CHECK_EQ(tg::last_program().nests, 1);
        CHECK_EQ(tg::last_program().tiled_nests, 1);
    }
    std::vector<float> after = p.to_vector();
    for (size_t i = 0; i < after.size(); i++) CHECK_EQ(after[i], before[i] - grad[i] * 0.5f);
    // another parameter's momentum update fused beside it (as an optimizer's updates fuse):
    // its new moment is a local that reads no sum, computed in the tile's epilogue too
    Tensor m = data({96, 80}, 5), q = data({96, 80}, 6), h = data({96, 80}, 7);
    std::vector<float> m0 = m.to_vector(), q0 = q.to_vector(), h0 = h.to_vector();
    before = p.to_vector();
    {
        th::EnvGuard env("TG_PASSES", "all");
        Tensor m1 = m.assign(m * 0.9f + h);
        tg::realize({p.assign(p - g * 0.5f), m1, q.assign(q - m1 * 0.5f)});
        CHECK_EQ(tg::last_program().nests, 1);
        CHECK_EQ(tg::last_program().tiled_nests, 1);
    }
    after = p.to_vector();
    std::vector<float> m2 = m.to_vector(), q2 = q.to_vector();
    for (size_t i = 0; i < m2.size(); i++) {
        CHECK_EQ(after[i], before[i] - grad[i] * 0.5f);
        CHECK_EQ(m2[i], m0[i] * 0.9f + h0[i]);
        CHECK_EQ(q2[i], q0[i] - (m0[i] * 0.9f + h0[i]) * 0.5f);
    }
}

// A convolution's input gradient (for each kernel position, the weight times the output
// gradient summed over the output channels) is stored as the input lies, [N, C, H, W], and its
// product takes each plane's H·W pixels as its columns, two loops merged into one: tiles of 64
// columns, where W alone would give 16 (and the channels, were they stored last, 32). The
// padded sum of the positions then reads along rows, not across channels. The bits are the
// loops'.
TEST_ON_CPU(tile_products_merge_an_image_plane_into_columns) {
    Tensor x = Tensor::randn({2, 32, 16, 16}, 40).requires_grad();
    Tensor w = Tensor::randn({64, 32, 3, 3}, 41);
    Tensor y = tg::nn::functional::conv2d(x, w, Tensor(), 1, 1);
    Tensor g = tg::gradients((y * y).sum(), {x})[0];
    std::string ir = optimized({g}, "all");
    CHECK(ir.find("[tiles: 4 x 64,") != std::string::npos);
    CHECK(ir.find("[tiles: 8 x 32,") == std::string::npos);
    std::vector<std::vector<float>> all = values({g}, "all");
    CHECK(all == values({g}, "none"));
    th::EnvGuard env("TG_THREADS", "3");
    CHECK(values({g}, "all") == all);
}

// A convolution's windows, packed as a product's columns, compare the column with the pad's
// edges at both ends of each image row: the pack runs a loop per stretch between the edges,
// each with its comparisons decided (the pad's stretch stores zeros, the others load with no
// select), as split_at_edges does for loops. The bits are the loops'.
TEST_ON_CPU(tile_products_pack_a_stretch_of_columns_between_pad_edges_at_a_time) {
    Tensor x = Tensor::randn({2, 3, 32, 32}, 42);
    Tensor w = Tensor::randn({16, 3, 3, 3}, 43);
    Tensor y = tg::nn::functional::conv2d(x, w, Tensor(), 1, 1);
    std::string c = tg::inspect({y * 1.0f}).c_source;
    CHECK(c.find("float ys[") != std::string::npos);
    CHECK(c.find("for (int64_t c = cb > 1 - col0 ? cb : 1 - col0, end = ce < 32 - col0 ? ce : "
                 "32 - col0; c < end; c++) {") != std::string::npos);
    CHECK(c.find("to[c - cb] = 0.0f;") != std::string::npos);
    std::vector<std::vector<float>> all = values({y}, "all");
    CHECK(all == values({y}, "none"));
    th::EnvGuard env("TG_THREADS", "3");
    CHECK(values({y}, "all") == all);
}

// A product over a batch of rows ([B,T,C] @ [C,N]) is one product over B·T rows when every
// index reads the batch and time variables only as b·T + t; a bias over time alone keeps the
// loops apart (its index would need t = row % T).
TEST(tile_products_merge_batch_loops_into_rows) {
    th::EnvGuard tile("TG_TILE_MIN_WORK", "1");
    Tensor x = data({4, 8, 16}), w = data({16, 40}, 1), b = data({8, 1}, 2);
    std::string merged = optimized({x.matmul(w)}, "all");
    CHECK(merged.find("[tiles: ") != std::string::npos);
    CHECK(merged.find(" < 32:") != std::string::npos);
    CHECK(merged.find(" < 4:") == std::string::npos);
    std::string apart = optimized({x.matmul(w) + b}, "all");
    CHECK(apart.find("[tiles: ") != std::string::npos);
    CHECK(apart.find(" < 32:") == std::string::npos);
    CHECK(apart.find(" < 4:") != std::string::npos);
    check_same_values({x.matmul(w), x.matmul(w) + b});
    CHECK(values({x.matmul(w)}, "all")[0] == values({x.matmul(w)}, "none")[0]);
}

// A product with 3 output columns (a convolution's weight gradient over 3 input channels)
// takes its 32 rows as the vectors' columns: tiles of 3 rows, all lanes used, where columns
// of 3 would leave 13 of each vector's 16 lanes idle. The bits stay the loops'.
TEST(tile_products_take_narrow_columns_as_rows) {
    th::EnvGuard tile("TG_TILE_MIN_WORK", "1");
    Tensor a = data({32, 300}), b = data({300, 3}, 1);
    CHECK(optimized({a.matmul(b)}, "all").find("[tiles: 3 x 32,") != std::string::npos);
    CHECK(values({a.matmul(b)}, "all")[0] == values({a.matmul(b)}, "none")[0]);
    Tensor wide = data({300, 8}, 2);   // 8 columns, half a vector: columns as lowered
    CHECK(optimized({a.matmul(wide)}, "all").find("[tiles: 8 x 16,") != std::string::npos);
    CHECK(values({a.matmul(wide)}, "all")[0] == values({a.matmul(wide)}, "none")[0]);
}

// Tiles of 4 rows by 64 columns, or of 8 rows by 32 where those pad fewer columns and rows:
// 200 columns are 256 in tiles of 64 and 224 in tiles of 32 (W2's hidden layer). The tile's
// shape changes only how many sums are in flight, never a sum's order: the bits of the loops.
TEST(tile_products_choose_the_tile_that_pads_least) {
    th::EnvGuard tile("TG_TILE_MIN_WORK", "1");
    Tensor x = data({32, 40}), w200 = data({40, 200}, 1), w256 = data({40, 256}, 2);
    Tensor x30 = data({30, 40});
    CHECK(optimized({x.matmul(w200)}, "all").find("[tiles: 8 x 32,") != std::string::npos);
    CHECK(optimized({x.matmul(w256)}, "all").find("[tiles: 4 x 64,") != std::string::npos);
    // 30 rows: 32 in tiles of 8 and of 4; 200 columns still pad less in tiles of 32
    CHECK(optimized({x30.matmul(w200)}, "all").find("[tiles: 8 x 32,") != std::string::npos);
    // 240 columns are 256 either way: 4 x 64 stays
    Tensor w240 = data({40, 240}, 3);
    CHECK(optimized({x.matmul(w240)}, "all").find("[tiles: 4 x 64,") != std::string::npos);
    for (const Tensor& y : {x.matmul(w200), x.matmul(w256), x30.matmul(w200), x.matmul(w240)})
        CHECK(values({y}, "all")[0] == values({y}, "none")[0]);
}

// The emitted C, character for character, for a tiled product with its epilogue (bias, relu):
// what TG_DEBUG=4 shows a reader of tile_products.
TEST(golden_c_for_a_tiled_product) {
    tg::Loc here = tg::Loc::here("golden.cpp", 9);
    Tensor x = data({32, 32}), w = data({32, 32}, 1), b = data({32}, 2);
    Tensor y = (tg::Operand(x.matmul(w, here), here) + b).relu(here);
    const char* want = R"golden(/* generated by tinygrad.hpp */
#include <math.h>
#include <stdint.h>
typedef void (*tg_chunk)(void *const *b, int64_t *err, int64_t lo, int64_t hi);
typedef void (*tg_run_chunks)(tg_chunk f, void *const *b, int64_t *err, int64_t n,
                              int64_t chunks);
typedef float tg_vf __attribute__((vector_size(64), may_alias));
typedef float tg_vf_unaligned __attribute__((vector_size(64), may_alias, aligned(4)));
#define TG_VEC(p, v) (((const tg_vf_unaligned *)(p))[v])
#define TG_TILE(rows, vectors) \
    for (int r = 0; r < rows; r++) for (int v = 0; v < vectors; v++)
#if defined(__AVX512F__)
#define TG_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define TG_IN_REGISTER(v) (void)(v)
#endif
#if defined(__AVX512F__)
#define TG_FMA(x, y, s) ((tg_vf)__builtin_ia32_vfmaddps512_mask( \
    (x) - (tg_vf){0}, (y), (s), (unsigned short)0xFFFF, 4))
#elif defined(__FMA__)
typedef float tg_v8 __attribute__((vector_size(32)));
static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {
    union { tg_vf v; tg_v8 h[2]; } a = {y}, b = {s};
    for (int i = 0; i < 2; i++)
        b.h[i] = __builtin_ia32_vfmaddps256(x - (tg_v8){0}, a.h[i], b.h[i]);
    return b.v;
}
#elif defined(__aarch64__)
#include <arm_neon.h>
static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {
    union { tg_vf v; float32x4_t q[4]; } a = {y}, b = {s};
    for (int i = 0; i < 4; i++) b.q[i] = vfmaq_n_f32(b.q[i], a.q[i], x);
    return b.v;
}
#else
static inline tg_vf TG_FMA(float x, tg_vf y, tg_vf s) {
    for (int l = 0; l < 16; l++) s[l] = fmaf(x, y[l], s[l]);
    return s;
}
#endif
static inline float tg_wheref(int c, float a, float b) {
    union { float f; uint32_t u; } x = {a}, y = {b};
    uint32_t m = -(uint32_t)(c != 0);
    x.u = (x.u & m) | (y.u & ~m);
    return x.f;
}

/* K0 forward float32 [32,32]: CMPEQ MUL REDUCE_SUM ADD CMPLT MAX WHERE
   from golden.cpp:9 */
static __attribute__((noinline)) void k0(const float *restrict buf2, const float *restrict buf1, const float *restrict buf3, float *restrict buf0, int64_t lo, int64_t hi) {
    /* a matrix product in tiles of 8 rows x 32 columns: 16 sums in
       vector registers (2 vectors of 16 floats a row) for each level of
       a sum's tree */
    for (int64_t task = lo; task < hi; task++) {
        int64_t row0 = 0;
        int64_t col0 = 0;
        int64_t row_end = row0 + 32 < 32 ? row0 + 32 : 32;
        int64_t col_end = col0 + 32 < 32 ? col0 + 32 : 32;
        for (int64_t r0 = row0; r0 < row_end; r0 += 8) {
            int64_t row[8];
            for (int r = 0; r < 8; r++) row[r] = r0 + r < row_end ? r0 + r : row_end - 1;
            for (int64_t c0 = col0; c0 < col_end; c0 += 32) {
                tg_vf sum0[8][2];
                tg_vf sum1[8][2];
                TG_TILE(8, 2) sum0[r][v] = (tg_vf){0};
                for (int64_t i2 = 0; i2 < 2; i2++) {
                    TG_TILE(8, 2) sum1[r][v] = (tg_vf){0};
                    for (int64_t i3 = 0; i3 < 16; i3++) {
                        {
                            tg_vf yv[2];
                            for (int v = 0; v < 2; v++) {
                                yv[v] = TG_VEC(&buf2[(c0 + (i2 * 512) + (i3 * 32))], v);
                                TG_IN_REGISTER(yv[v]);
                            }
                            for (int r = 0; r < 8; r++) {
                                float xr = buf1[((row[r] * 32) + (i2 * 16) + i3)];
                                for (int v = 0; v < 2; v++) sum1[r][v] = TG_FMA(xr, yv[v], sum1[r][v]);
                            }
                        }
                    }
                    TG_TILE(8, 2) sum0[r][v] += sum1[r][v];
                }
                int64_t rn = row_end - r0 < 8 ? row_end - r0 : 8;
                int64_t cn = col_end - c0 < 32 ? col_end - c0 : 32;
                for (int64_t r = 0; r < rn; r++) {
                    int64_t i0 = r0 + r;
                    for (int64_t c = 0; c < cn; c++) {
                        int64_t i1 = c0 + c;
                        float acc0 = ((const float *)sum0[r])[c];
                        float t0 = (acc0 + buf3[i1]);
                        buf0[((i0 * 32) + i1)] = tg_wheref(((t0 < 0.0f) | (t0 == 0.0f)), 0.0f, t0);
                    }
                }
            }
        }
    }
}

void tg_program(void *const *b, int64_t *err, tg_run_chunks run_chunks) {
    (void)b; (void)err; (void)run_chunks;
    k0((const float *)b[2], (const float *)b[1], (const float *)b[3], (float *)b[0], 0, 1LL);
}
)golden";
    CHECK_EQ(optimized({y}, "all").find("[tiles: 8 x 32, panels of 32 columns, 1 tasks]") !=
                 std::string::npos, true);
    th::EnvGuard env("TG_PASSES", "all");
    CHECK_EQ(tg::inspect({y}).c_source, std::string(want));
}

// A panel of y's columns is packed 16 columns at a time: where a row of y holds them, as one
// copy of a size the C compiler knows (a vector's move, not a call of memcpy) and the
// panel's last, shorter stretch as one more; where they lie across the rows (a transposed
// weight, as Linear reads it), 16 columns' 16 terms at a time where a term loop of 16 reads
// along a row (a block copied, then stored transposed), the rest (here the last 8 terms, and
// the last 8 columns) in loops of a move each. All give the bits of the loops.
TEST(tile_products_pack_columns_of_a_row_as_one_copy) {
    th::EnvGuard tile("TG_TILE_MIN_WORK", "1");
    Tensor x = data({32, 40}), w = data({40, 200}, 1), w_out_in = data({200, 40}, 2);
    Tensor along = x.matmul(w), across = x.matmul(w_out_in.t());
    for (const Tensor& y : {along, across})
        CHECK(values({y}, "all")[0] == values({y}, "none")[0]);
    th::EnvGuard passes("TG_PASSES", "all");
    std::string c = tg::inspect({along}).c_source;
    CHECK(c.find("a panel's columns") != std::string::npos);
    CHECK(c.find(", 16 * sizeof(float));") != std::string::npos);
    CHECK(c.find(", (col_end - col0 - cb) * sizeof(float));") != std::string::npos);
    c = tg::inspect({across}).c_source;
    CHECK(c.find("a panel's columns") != std::string::npos);
    CHECK_EQ(th::count_of(c, "__builtin_memcpy(block[c], &buf"), 1);
    CHECK_EQ(th::count_of(c, "to[n * 32 + c] = block[c][n];"), 1);
    CHECK_EQ(th::count_of(c, "to[c - cb] = buf"), 3);
}

// A sum over rows whose elements lie along the outputs (a bias's gradient) is tiled too:
// vector sums across the columns, each in its untiled order. A sum along a row is not (its
// terms would have to be packed across the rows first).
TEST(tile_products_sum_columns_read_along_them) {
    Tensor x = data({1030, 70}), w = data({1030, 70}, 1);
    CHECK(optimized({x.sum(0) * 1.0f}, "all").find("[tiles: 1 x ") != std::string::npos);
    CHECK(values({x.sum(0)}, "all")[0] == values({x.sum(0)}, "none")[0]);
    // a sum of products over the rows of computed operands stays in loops, where each product
    // is fused into the sum (packing would round it first): the bits of the loops, with values
    // whose products are not exact floats; so does one of loads whose columns fill no whole
    // vectors (70)
    Tensor a = x * 0.1f, b = w * 0.3f;
    CHECK(optimized({(a * b).sum(0) * 1.0f}, "all").find("[tiles:") == std::string::npos);
    CHECK(values({(a * b).sum(0)}, "all")[0] == values({(a * b).sum(0)}, "none")[0]);
    CHECK(optimized({(x * w).sum(0) * 1.0f}, "all").find("[tiles:") == std::string::npos);
    std::vector<float> xv = x.to_vector(), wv = w.to_vector();
    std::vector<float> got = values({(x * w).sum(0)}, "all")[0];
    std::vector<double> want(70, 0.0);
    for (size_t i = 0; i < 1030; i++)
        for (size_t j = 0; j < 70; j++) want[j] += double(xv[i * 70 + j]) * double(wv[i * 70 + j]);
    CHECK_ALL_NEAR(got, want, 1e-4);
    CHECK(optimized({x.sum(1) * 1.0f}, "all").find("[tiles:") == std::string::npos);
}

// A sum over rows of products of two loads read along the outputs (a layer norm's weight
// gradient: Σ_rows dy·x̂) multiplies vectors of both where they lie, each lane's multiply-add
// fused as in the loops: the bits of TG_PASSES=none on 1 and 3 threads, near float64, for
// columns that fill vectors of 64, 32 and 16 floats, and next to a plain sum of columns.
TEST(tile_products_sum_products_of_columns_in_place) {
    for (int64_t cols : {128, 96, 48}) {
        Tensor dy = data({1027, cols}) * 0.7f, xh = data({1027, cols}, 1) * 1.3f;
        dy.realize();
        xh.realize();
        Tensor g = (dy * xh).sum(0), bias = dy.sum(0);
        std::string ir = optimized({g * 1.0f, bias * 1.0f}, "all");
        CHECK(ir.find("[tiles: 1 x ") != std::string::npos);
        std::string c = tg::inspect({g * 1.0f}).c_source;
        CHECK(c.find("TG_FMAV(TG_VEC(&") != std::string::npos);
        std::vector<float> tiled = values({g, bias}, "all")[0];
        CHECK(tiled == values({g, bias}, "none")[0]);
        CHECK(values({g, bias}, "all")[1] == values({g, bias}, "none")[1]);
        for (const char* threads : {"1", "3"}) {
            th::EnvGuard env("TG_THREADS", threads);
            CHECK(values({g, bias}, "all")[0] == tiled);
        }
        std::vector<float> dv = dy.to_vector(), xv = xh.to_vector();
        std::vector<double> want(size_t(cols), 0.0);
        for (size_t i = 0; i < 1027; i++)
            for (size_t j = 0; j < size_t(cols); j++)
                want[j] += double(dv[i * size_t(cols) + j]) * double(xv[i * size_t(cols) + j]);
        CHECK_ALL_NEAR(tiled, want, 1e-3);
    }
}

// A concatenation (and a pad) reads each part of its axis under a comparison of the axis's
// variable with the part's edge, for every element; split_at_edges runs one loop per part,
// where each comparison is decided and its select goes: the bits of TG_PASSES=none on 1 and
// 3 threads. A nest's outer loop stays whole; a comparison with another variable in it
// splits nothing.
TEST(split_at_edges_runs_a_loop_per_part_of_a_concatenation) {
    const char* without = "simplify,fuse_loops,substitute_temps,dead_stores,first_write,"
                          "order_nests,local_temps,tile_products,sum_lanes,parallel_loops,"
                          "plan_memory";
    Tensor a = data({16, 8, 40}), b = data({16, 8, 24}, 1), c = data({16, 8, 8}, 2);
    Tensor joined = tg::cat({a, b * 3.0f, c.exp()}, 2) * 0.5f;
    Tensor padded = data({16, 8, 20}, 3).pad({{0, 0}, {0, 0}, {5, 7}}) - 0.25f;
    for (Tensor t : {joined, padded}) {
        std::string c_split, c_whole;
        {
            th::EnvGuard env("TG_PASSES", "all");
            c_split = tg::inspect({t}).c_source;
        }
        {
            th::EnvGuard env("TG_PASSES", without);
            c_whole = tg::inspect({t}).c_source;
        }
        CHECK(c_whole.find("tg_where") != std::string::npos);
        CHECK(c_split.find("tg_where") == std::string::npos);
        std::vector<float> split = values({t}, "all")[0];
        CHECK(split == values({t}, "none")[0]);
        CHECK(split == values({t}, without)[0]);
        for (const char* threads : {"1", "3"}) {
            th::EnvGuard env("TG_THREADS", threads);
            CHECK(values({t}, "all")[0] == split);
        }
    }
    // edges one element from the ends: pieces of one iteration, each with its own sums
    Tensor sums = data({16, 8, 6, 10}).sum(3).pad({{0, 0}, {0, 0}, {1, 1}}) * 3.0f;
    std::vector<float> split = values({sums}, "all")[0];
    CHECK(split == values({sums}, "none")[0]);
    CHECK(split == values({sums}, without)[0]);
    std::vector<float> av = a.to_vector(), got = values({joined}, "all")[0];
    for (size_t row = 0; row < 16 * 8; row++)
        for (size_t j = 0; j < 40; j++) CHECK_EQ(got[row * 72 + j], av[row * 40 + j] * 0.5f);
    // the edge moves with the outer variable (a causal mask): no loop is split
    Tensor above = Tensor::arange(64).reshape({64, 1}) < Tensor::arange(64);
    Tensor tri = data({64, 64}).masked_fill(above, 0.0f) * 2.0f;
    std::string ir = optimized({tri}, "all");
    CHECK(ir == optimized({tri}, without));
    CHECK(values({tri}, "all")[0] == values({tri}, "none")[0]);
}

// A convolution's input gradient before a max pool's gradient: the padded sum of its kernel
// positions' products goes into an array for each channel's plane (local_temps), which the
// pool's gradient reads. The loops inside that channel's loop split at the pad's edges, so
// the sum stores no select; the channel's loop, which holds the array, stays whole. The bits
// of TG_PASSES=none, on 1 and 3 threads.
TEST_ON_CPU(split_at_edges_splits_the_loops_inside_one_that_holds_an_array) {
    Tensor a = data({2, 8, 16, 16}).requires_grad();
    Tensor w = data({16, 8, 3, 3}, 1);
    Tensor pooled = tg::nn::functional::max_pool2d(a.relu(), 2);
    Tensor y = tg::nn::functional::conv2d(pooled, w, Tensor(), 1, 1);
    Tensor g = tg::gradients((y * y).sum(), {a})[0];
    std::string ir = optimized({g}, "all");
    size_t local = ir.find(" local to loop ");
    CHECK(local != std::string::npos);
    std::string array = ir.substr(0, local);
    array = array.substr(array.rfind('\n') + 1);
    array = array.substr(0, array.find(':')) + "[";   // "bufN["
    int stores = 0, selects = 0;
    for (size_t at = 0, end; at < ir.size(); at = end + 1) {
        end = std::min(ir.find('\n', at), ir.size());
        std::string line = ir.substr(at, end - at);
        size_t first = line.find_first_not_of(' ');
        if (first == std::string::npos || line.compare(first, array.size(), array)) continue;
        stores++;
        selects += line.find("where(") != std::string::npos;
    }
    CHECK(stores > 1);
    CHECK_EQ(selects, 0);
    std::vector<float> all = values({g}, "all")[0];
    CHECK(all == values({g}, "none")[0]);
    for (const char* threads : {"1", "3"}) {
        th::EnvGuard env("TG_THREADS", threads);
        CHECK(values({g}, "all")[0] == all);
    }
}

// A max pool's gradient (window 2) reads the index its window kept and that window's gradient
// at (i / 2, j / 2) and compares (i % 2, j % 2) with the index; an average pool's reads its
// window's gradient at (i / 2, j / 2). Each loop that divides its variable runs as a loop of
// halves around one of 2: no loop variable is divided. The bits of TG_PASSES=none, on 1 and 3
// threads.
TEST_ON_CPU(split_divided_runs_a_divided_loop_as_quotient_and_remainder) {
    auto divided_vars = [](const std::string& ir) {   // "(i2 / 2)", "(i3 % 2)"
        int n = 0;
        for (size_t at = 0; (at = ir.find("(i", at)) != std::string::npos; at++) {
            size_t end = ir.find_first_not_of("0123456789", at + 2);
            n += end > at + 2 && end != std::string::npos &&
                 (ir.compare(end, 3, " / ") == 0 || ir.compare(end, 3, " % ") == 0);
        }
        return n;
    };
    Tensor a = data({2, 8, 16, 16}).requires_grad();
    Tensor max_pooled = tg::nn::functional::max_pool2d(a.relu(), 2);
    Tensor avg_pooled = tg::nn::functional::avg_pool2d(a, 2);
    for (const Tensor& pooled : {max_pooled, avg_pooled}) {
        Tensor g = tg::gradients((pooled * pooled).sum(), {a})[0];
        std::string before = optimized({g}, "simplify");
        std::string after = optimized({g}, "simplify,split_divided");
        CHECK(divided_vars(before) > 0);
        CHECK_EQ(divided_vars(after), 0);
        CHECK(th::count_of(after, "for i") > th::count_of(before, "for i"));
        CHECK_EQ(divided_vars(optimized({g}, "all")), 0);
        std::vector<float> all = values({g}, "all")[0];
        CHECK(all == values({g}, "none")[0]);
        for (const char* threads : {"1", "3"}) {
            th::EnvGuard env("TG_THREADS", threads);
            CHECK(values({g}, "all")[0] == all);
        }
    }
    // i / 3 and i / 2 together: no split leaves neither, so the loop stays
    Tensor x = data({2, 12});
    Tensor thirds = x.reshape({2, 4, 3}).sum(2, true).expand({2, 4, 3}).reshape({2, 12});
    Tensor halves = x.reshape({2, 6, 2}).sum(2, true).expand({2, 6, 2}).reshape({2, 12});
    Tensor mixed = thirds + halves;
    std::string kept = optimized({mixed}, "simplify");
    CHECK(divided_vars(kept) > 0);
    CHECK_EQ(optimized({mixed}, "simplify,split_divided"), kept);
}

// A long float sum runs as 16 lanes: lane j adds the j-th element of each block of 16, in
// block order, and the lanes are summed as a tree. One loop of 16 independent updates, no
// inner loop of dependent ones; the values agree with float64 on awkward lengths (1, primes,
// a block and one, 1023, 1025, empty), along strided and broadcast reads, and are the same
// bits on 1 and 3 threads. Sums of products and of strided reads keep the blocked order.
TEST_ON_CPU(sum_lanes_sums_a_long_axis_in_sixteen_lanes) {
    Tensor x = data({3, 256});
    std::string lanes = optimized({x.sum(1)}, "simplify,sum_lanes");
    std::string blocked = optimized({x.sum(1)}, "simplify");
    CHECK_EQ(th::count_of(blocked, "for i"), 3);      // rows, blocks, each block's 16 terms
    CHECK_EQ(th::count_of(lanes, "for i"), 2);        // rows, blocks: the 16 lanes in each
    CHECK_EQ(th::count_of(lanes, " += buf1[("), 16);
    CHECK(lanes.find("buf1[(i0*256 + i1*16 + 15)]") != std::string::npos);
    CHECK_EQ(th::count_of(optimized({(x * x).sum(1)}, "simplify,sum_lanes"), "for i"), 3);
    Tensor columns = data({256, 3}).transpose(0, 1);   // lanes would load 3 elements apart
    CHECK_EQ(th::count_of(optimized({columns.sum(1)}, "simplify,sum_lanes"), "for i"), 3);
    Tensor r = data({7, 1000}, 3);   // INTERP runs the passes too: the same bits
    CHECK(r.to("INTERP").exp().sum(1).to_vector() == r.exp().sum(1).to_vector());

    for (int64_t n : {0, 1, 17, 31, 256, 257, 1023, 1025, 4099}) {
        Tensor a = data({3, n}, int(n % 5));
        Tensor b = data({n, 2}, 1).transpose(0, 1);   // a strided axis
        Tensor row = data({n}, 2);
        std::vector<Tensor> sums = {a.sum(1), b.exp().sum(1), (a + row).sum(1), a.sum()};
        std::vector<std::vector<float>> got = values(sums, "all");
        auto f64 = [](const Tensor& t) {
            std::vector<float> v = (t * 1.0f).to_vector();
            return std::vector<double>(v.begin(), v.end());
        };
        std::vector<double> av = f64(a), bv = f64(b), rv = f64(row);
        std::vector<std::vector<double>> want(4);
        double all = 0;
        for (int64_t r = 0; r < 3; r++) {   // b has 2 rows
            double s = 0, e = 0, p = 0;
            for (int64_t i = 0; i < n; i++) {
                s += av[size_t(r * n + i)];
                if (r < 2) e += std::exp(bv[size_t(r * n + i)]);
                p += av[size_t(r * n + i)] + rv[size_t(i)];
            }
            want[0].push_back(s);
            if (r < 2) want[1].push_back(e);
            want[2].push_back(p);
            all += s;
        }
        want[3].push_back(all);
        for (size_t k = 0; k < sums.size(); k++) CHECK_ALL_NEAR(got[k], want[k], 1e-6);
        for (const char* threads : {"1", "3"}) {
            th::EnvGuard env("TG_THREADS", threads);
            CHECK(values(sums, "all") == got);
        }
    }
}
