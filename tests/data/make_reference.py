#!/usr/bin/env python3
"""Makes the references that tests/reference.hpp reads, beside this script:
  pooling_reference.txt  poolings of torch.nn.functional (tests/test_ops.cpp,
                         ops_pooling_options_match_pytorch)
  loss_reference.txt     losses of torch.nn.functional (tests/test_training.cpp,
                         loss_more_pytorch_losses_match_pytorch)
  layout_reference.txt   pixel_shuffle, unfold, fold and the like (tests/test_ops.cpp,
                         ops_layout_functions_match_pytorch)
  product_reference.txt  bilinear, cdist and embedding_bag (tests/test_ops.cpp,
                         ops_bilinear_cdist_embedding_bag_match_pytorch)
  optimizer_reference.txt  Adamax, NAdam, RAdam, Adadelta, Rprop and ASGD on a quadratic: the
                         parameter after each of 8 steps (tests/test_training.cpp,
                         optim_adamax_nadam_radam_adadelta_rprop_asgd_match_pytorch)
  math_reference.txt     diagonal, trace, diag, outer, kron, diff, logaddexp (tests/test_ops.cpp,
                         ops_diagonal_kron_diff_logaddexp_search_match_pytorch)
  math_more_reference.txt  cummax, logcumsumexp, median, quantile, tensordot, cross, hypot,
                         bincount, histc, rot90 and the like (tests/test_math.cpp,
                         ops_scans_order_statistics_and_products_match_pytorch)
  scatter_reference.txt  scatter, scatter_reduce (each reduction, with and without self),
                         index_copy, index_fill, index_reduce, max_pool's indices and
                         max_unpool (tests/test_ops.cpp,
                         ops_scatter_and_scatter_reduce_match_pytorch)
  linalg_reference.txt   torch.linalg's det, slogdet, inv, solve, cholesky, qr, solve_triangular,
                         lstsq, matrix_power, multi_dot, norms, eigh, svd, pinv, matrix_rank,
                         cond, lu_factor, lu, lu_solve and matrix_exp; erfinv, cov, corrcoef
                         (tests/test_math.cpp, ops_linalg_matches_pytorch)
  special_reference.txt  lgamma, digamma, polygamma, nansum, nanmean, aminmax, heaviside, ldexp,
                         trapezoid, renorm, pdist, vander, vecdot, multilabel_margin_loss
                         (tests/test_math.cpp, ops_special_functions_and_more_match_pytorch)
  parametrization_reference.txt  weight_norm and spectral_norm on Linear, Conv1d and
                         ConvTranspose1d (tests/test_training.cpp,
                         nn_weight_norm_and_spectral_norm_match_pytorch)
  lbfgs_reference.txt    LBFGS on the 3-variable Rosenbrock function, two parameters, without
                         and with its strong Wolfe line search: the parameters and the loss
                         after each step (tests/test_training.cpp, optim_lbfgs_matches_pytorch)
  basics_reference.txt   isclose, isin, diag_embed, take_along_dim, logdet, addmm and its kin,
                         addcmul, addcdiv, the stacks, float_power, logaddexp2, frac, tile,
                         repeat_interleave, take, masked_scatter and the like
                         (tests/test_math.cpp, ops_basics_match_pytorch)
  names_reference.txt    nanmedian, nanquantile, fmax, fmin, gcd, lcm, mv, vdot, inner, dist,
                         diagflat, std_mean, var_mean, cholesky_solve, cholesky_inverse, msort,
                         hsplit, vsplit, dsplit, broadcast_tensors and PyTorch's other names;
                         slice_scatter, select_scatter, diagonal_scatter, index_put,
                         unique_consecutive, tensorinv, tensorsolve (tests/test_math.cpp,
                         ops_more_names_match_pytorch)
  special_more_reference.txt  torch.special's ndtr, log_ndtr, ndtri, erfcx, i0, i0e, i1, i1e,
                         entr, xlog1py, multigammaln and the windows (tests/test_math.cpp,
                         ops_torch_special_and_windows_match_pytorch)
  ctc_reference.txt      ctc_loss: reductions, padded and end-to-end targets, blank, repeats,
                         unbatched, zero_infinity (tests/test_math.cpp, nn_ctc_loss_matches_pytorch)
  sampling_reference.txt affine_grid and grid_sample (each mode, padding mode and
                         align_corners) (tests/test_math.cpp,
                         ops_affine_grid_grid_sample_match_pytorch)
  transformer_reference.txt  a TransformerEncoder, a TransformerDecoder and a Transformer:
                         their weights, inputs, outputs and the inputs' gradients
                         (tests/test_training.cpp, nn_transformer_*_match_pytorch)
Each function runs on fixed float64 inputs, written first, one line each:
  input NAME [SHAPE] {VALUES}
then each case's result y (in float64) and the gradients of sum(y·c) for its inputs that need
one (none for an integer result), c_i = i/10 - 1 over y's elements in order:
  case NAME [SHAPE OF Y] {Y} {GRADIENT} ...
Numbers have 17 significant digits. The tests repeat each case's call.
Run with PyTorch installed (Debian: apt-get install python3-torch): python3 make_reference.py
"""
import os
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def numbers(t):
    return "{" + ", ".join("%.17g" % v for v in t.detach().reshape(-1).tolist()) + "}"


def shape(t):
    return "[" + ",".join(str(n) for n in t.shape) + "]"


def tensor(values, *sizes):
    return torch.tensor(values, dtype=torch.float64).reshape(*sizes)


def write(file_name, inputs, cases):
    """cases: (name, names of the inputs that need gradients, function of those inputs)"""
    with open(os.path.join(HERE, file_name), "w") as out:
        for name, x in inputs.items():
            out.write("input %s %s %s\n" % (name, shape(x), numbers(x)))
        for name, sources, f in cases:
            xs = [inputs[s].clone().requires_grad_() for s in sources]
            y = f(*xs).double()
            c = torch.arange(y.numel(), dtype=torch.float64).reshape(y.shape) / 10 - 1
            if xs:
                (y * c).sum().backward()
            grads = " ".join(numbers(x.grad) for x in xs)
            out.write("case %s %s %s %s\n" % (name, shape(y), numbers(y), grads))


x2 = (torch.arange(2 * 2 * 7 * 6, dtype=torch.float64).reshape(2, 2, 7, 6) * 0.37 % 2.3) - 1.1
x2[0, 0, 1, 1] = x2[0, 0, 1, 2]   # a tie inside a window
x3 = (torch.arange(2 * 5 * 4 * 5, dtype=torch.float64).reshape(1, 2, 5, 4, 5) * 0.61 % 1.9) - 0.8
x1 = x2.reshape(2, 2, 42)[:, :, :11].contiguous()
write("pooling_reference.txt", {"x1": x1, "x2": x2, "x3": x3}, [
    ("max_pool2d_ceil", ["x2"], lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
    ("max_pool2d_ceil_unpadded", ["x2"], lambda x: F.max_pool2d(x, 2, 2, 0, ceil_mode=True)),
    ("avg_pool2d_ceil", ["x2"], lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
    ("avg_pool2d_ceil_pad_uncounted", ["x2"],
     lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d_ceil_unpadded", ["x2"], lambda x: F.avg_pool2d(x, 2, 2, 0, ceil_mode=True)),
    ("avg_pool2d_divisor", ["x2"], lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=4)),
    ("max_pool1d_ceil", ["x1"], lambda x: F.max_pool1d(x, 3, 3, 1, ceil_mode=True)),
    ("max_pool3d", ["x3"], lambda x: F.max_pool3d(x, 2, (2, 1, 2), (1, 0, 1))),
    ("avg_pool3d_ceil", ["x3"], lambda x: F.avg_pool3d(x, 2, 2, 0, ceil_mode=True)),
    ("adaptive_max_pool1d", ["x1"], lambda x: F.adaptive_max_pool1d(x, 4)),
    ("adaptive_max_pool2d", ["x2"], lambda x: F.adaptive_max_pool2d(x, (3, 4))),
    ("adaptive_max_pool3d", ["x3"], lambda x: F.adaptive_max_pool3d(x, (2, 3, 2))),
    ("adaptive_avg_pool3d", ["x3"], lambda x: F.adaptive_avg_pool3d(x, (3, 2, 4))),
    ("lp_pool2d", ["x2"], lambda x: F.lp_pool2d(x, 2, 2)),
    ("lp_pool1d_ceil", ["x1"], lambda x: F.lp_pool1d(x.abs() + 0.1, 3, 3, 2, ceil_mode=True)),
])

losses = {
    "a": tensor([0.5, -1.25, 2.0, 1.5, 0.25, -0.75, -2.0, 1.0, 0.5, 0.0, 3.0, -1.5], 4, 3),
    "b": tensor([1.0, 0.25, -0.5, 1.5, -1.0, 0.75, 0.5, 2.0, -0.25, 1.25, -2.0, 0.5], 4, 3),
    "c": tensor([-0.5, 1.0, 0.25, 2.0, 0.5, -1.5, 1.0, -0.75, 0.0, 0.5, 1.5, 1.0], 4, 3),
    "sign": tensor([1, -1, -1, 1], 4),                                    # ±1 per row
    "signs": tensor([1, -1, -1, 1, 1, -1, 1, 1, -1, -1, 1, -1], 4, 3),   # ±1 per element
    "labels": tensor([1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0], 4, 3),       # 0 or 1 per element
    "classes": tensor([0, 2, 1, 2], 4),                                  # one class per row
    "weight": tensor([0.5, 2.0, 1.0], 3),                                # one per class
    "var": tensor([0.5, 2.0, 1e-8, 1.0], 4, 1),
    "counts": tensor([0, 1, 2, 3, 0, 5, 1, 0, 2, 4, 1, 0], 4, 3),
    # PyTorch's layout for cross_entropy: classes on axis 1 of [N, C, d]
    "logits": torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) * 0.7 % 2.9 - 1.2,
    "targets": tensor([0, 2, 1, 1, 2, 0, 0, 1], 2, 4),
}
cases = []
for r in ("mean", "sum", "none"):
    cases += [
        ("margin_ranking_" + r, ["a", "b"], lambda a, b, r=r: F.margin_ranking_loss(
            a[:, 0], b[:, 0], losses["sign"], margin=0.5, reduction=r)),
        ("hinge_embedding_" + r, ["a"], lambda a, r=r: F.hinge_embedding_loss(
            a, losses["signs"], margin=1.5, reduction=r)),
        ("soft_margin_" + r, ["a"], lambda a, r=r: F.soft_margin_loss(a, losses["signs"], reduction=r)),
        ("multilabel_soft_margin_" + r, ["a"], lambda a, r=r: F.multilabel_soft_margin_loss(
            a, losses["labels"], weight=losses["weight"], reduction=r)),
        ("cosine_embedding_" + r, ["a", "b"], lambda a, b, r=r: F.cosine_embedding_loss(
            a, b, losses["sign"], margin=0.2, reduction=r)),
        ("triplet_margin_" + r, ["a", "b", "c"], lambda a, b, c, r=r: F.triplet_margin_loss(
            a, b, c, margin=1.0, reduction=r)),
        ("gaussian_nll_" + r, ["a", "b"], lambda a, b, r=r: F.gaussian_nll_loss(
            a, b, losses["var"], reduction=r)),
        ("poisson_nll_" + r, ["a"], lambda a, r=r: F.poisson_nll_loss(a, losses["counts"], reduction=r)),
        ("multi_margin_" + r, ["a"], lambda a, r=r: F.multi_margin_loss(
            a, losses["classes"].long(), reduction=r)),
    ]
cases += [
    ("triplet_margin_swap_p1", ["a", "b", "c"], lambda a, b, c: F.triplet_margin_loss(
        a, b, c, margin=2.0, p=1, swap=True)),
    ("pairwise_distance", ["a", "b"], lambda a, b: F.pairwise_distance(a, b)),
    ("gaussian_nll_full", ["a", "b"], lambda a, b: F.gaussian_nll_loss(
        a, b, b.abs() + 0.1, full=True, eps=0.2)),
    ("poisson_nll_full", ["a"], lambda a: F.poisson_nll_loss(
        a.abs(), losses["counts"], log_input=False, full=True, reduction="none")),
    ("multi_margin_p2_weight", ["a"], lambda a: F.multi_margin_loss(
        a, losses["classes"].long(), p=2, margin=0.5, weight=losses["weight"], reduction="none")),
    ("cross_entropy_classes_on_axis_1", ["logits"], lambda x: F.cross_entropy(
        x, losses["targets"].long(), weight=losses["weight"], ignore_index=1, reduction="none")),
    ("nll_loss_classes_on_axis_1", ["logits"], lambda x: F.nll_loss(
        x, losses["targets"].long(), weight=losses["weight"])),
]
write("loss_reference.txt", losses, cases)

image = torch.arange(2 * 8 * 4 * 6, dtype=torch.float64).reshape(2, 8, 4, 6) / 7 - 3
write("layout_reference.txt", {"image": image}, [
    ("pixel_shuffle", ["image"], lambda x: F.pixel_shuffle(x, 2)),
    ("pixel_unshuffle", ["image"], lambda x: F.pixel_unshuffle(x, 2)),
    ("channel_shuffle", ["image"], lambda x: x.reshape(2, 4, 2, 4, 6).transpose(1, 2)
     .reshape(2, 8, 4, 6)),   # nn.ChannelShuffle(4), which has no autograd in 1.13
    ("unfold", ["image"], lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1))),
    ("fold", ["image"], lambda x: F.fold(x.reshape(2, 24, 8), (4, 4), (2, 3), padding=(1, 0),
                                         dilation=(2, 1))),
    ("fold_strided", ["image"], lambda x: F.fold(x.reshape(2, 48, 4), (7, 5), 2, stride=3)),
    ("tensor_unfold", ["image"], lambda x: x.unfold(3, 3, 2)),
    ("unflatten", ["image"], lambda x: x.unflatten(1, (2, -1))),
])

products = {
    "x1": torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4) * 0.31 % 1.7 - 0.8,
    "x2": torch.arange(2 * 3 * 5, dtype=torch.float64).reshape(2, 3, 5) * 0.47 % 1.3 - 0.6,
    "weight": torch.arange(6 * 4 * 5, dtype=torch.float64).reshape(6, 4, 5) * 0.13 % 0.9 - 0.45,
    "bias": tensor([0.5, -0.25, 0.125, 1.0, -1.5, 0.75], 6),
    "rows": torch.arange(2 * 4 * 5, dtype=torch.float64).reshape(2, 4, 5) * 0.29 % 1.1 - 0.5,
}
products["rows"][1, 2] = products["x2"][1, 1]   # a distance of 0
products["table"] = torch.arange(7 * 3, dtype=torch.float64).reshape(7, 3) * 0.43 % 1.9 - 0.9
products["ids"] = tensor([1, 4, 4, 0, 6, 2, 2, 5, 3], 9)   # bags [1 4 4] [] [0 6 2] [2 5 3]
products["offsets"] = tensor([0, 3, 3, 6], 4)
products["ids2"] = tensor([3, 0, 5, 5, 2, 0, 6, 1], 2, 4)
products["sample_weights"] = tensor([0.5, -1.0, 2.0, 1.5, 0.25, 1.0, -0.5, 3.0, 0.75], 9)
L = lambda name: products[name].long()
write("product_reference.txt", products, [
    ("bilinear", ["x1", "x2", "weight", "bias"], F.bilinear),
    ("cdist", ["x2", "rows"], lambda a, b: torch.cdist(a, b)),
    ("cdist_p1", ["x2", "rows"], lambda a, b: torch.cdist(a, b, p=1)),
    ("cdist_p3", ["x2", "rows"], lambda a, b: torch.cdist(a, b, p=3)),
    ("cdist_inf", ["x2", "rows"], lambda a, b: torch.cdist(a, b, p=float("inf"))),
    ("embedding_bag_mean", ["table"], lambda w: F.embedding_bag(L("ids"), w, L("offsets"))),
    ("embedding_bag_sum_weighted", ["table", "sample_weights"], lambda w, s: F.embedding_bag(
        L("ids"), w, L("offsets"), mode="sum", per_sample_weights=s)),
    ("embedding_bag_max", ["table"], lambda w: F.embedding_bag(L("ids"), w, L("offsets"),
                                                               mode="max")),
    ("embedding_bag_last_offset_padding", ["table"], lambda w: F.embedding_bag(
        L("ids"), w, torch.tensor([0, 3, 3, 6, 9]), include_last_offset=True, padding_idx=2)),
    ("embedding_bag_2d_max_padding", ["table"], lambda w: F.embedding_bag(
        L("ids2"), w, mode="max", padding_idx=5)),
])

def nadam_2(params, lr, betas, eps, weight_decay, momentum_decay):
    """PyTorch 2's NAdam step (1.13's counts mu_t twice in its second product), in float64"""
    state = {"t": 0, "mu_product": 1.0, "m": torch.zeros_like(params[0]),
             "v": torch.zeros_like(params[0])}
    beta1, beta2 = betas

    def step():
        p = params[0]
        g = p.grad + weight_decay * p
        state["t"] += 1
        t = state["t"]
        mu = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        state["mu_product"] *= mu
        state["m"] = beta1 * state["m"] + (1 - beta1) * g
        state["v"] = beta2 * state["v"] + (1 - beta2) * g * g
        d = (state["v"] / (1 - beta2 ** t)).sqrt() + eps
        with torch.no_grad():
            p -= lr * (1 - mu) / (1 - state["mu_product"]) * g / d
            p -= lr * mu_next / (1 - state["mu_product"] * mu_next) * state["m"] / d
    return step


quadratic = {
    "p0": tensor([0.5, -1.25, 2.0, 1.5, 0.25, -0.75], 2, 3),
    "c": tensor([1.0, 0.25, -0.5, 1.5, -1.0, 0.75], 2, 3),
    "w": tensor([0.5, 2.0, 1.0, 1.5, 0.75, 1.25], 2, 3),
}
optimizers = {
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=0.05, betas=(0.8, 0.95), eps=1e-6,
                                            weight_decay=0.1).step,
    "nadam": lambda ps: nadam_2(ps, 0.05, (0.85, 0.95), 1e-6, 0.1, 0.02),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=0.05, betas=(0.8, 0.9), eps=1e-6,
                                          weight_decay=0.1).step,
    "adadelta": lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.8, eps=1e-4,
                                                weight_decay=0.1).step,
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=0.3, etas=(0.4, 1.5),
                                          step_sizes=(0.01, 0.5)).step,
    "asgd": lambda ps: torch.optim.ASGD(ps, lr=0.2, lambd=0.05, alpha=0.6, t0=3,
                                        weight_decay=0.1).step,
}
with open(os.path.join(HERE, "optimizer_reference.txt"), "w") as out:
    for name, x in quadratic.items():
        out.write("input %s %s %s\n" % (name, shape(x), numbers(x)))
    for name, make in optimizers.items():
        p = quadratic["p0"].clone().requires_grad_()
        step = make([p])
        for s in range(1, 9):
            p.grad = None
            (0.5 * quadratic["w"] * (p - quadratic["c"]) ** 2).sum().backward()
            step()
            out.write("case %s_%d %s %s\n" % (name, s, shape(p), numbers(p)))
        if name == "asgd":   # the average of the steps from t0 on
            ax = step.__self__.state[p]["ax"]
            out.write("case asgd_ax %s %s\n" % (shape(ax), numbers(ax)))


matrices = {
    "m": torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4) * 0.37 % 1.3 - 0.6,
    "v": tensor([0.5, -1.5, 2.0], 3),
    "w": tensor([1.0, 0.25, -0.5, 3.0], 4),
    "a": tensor([0.5, -1.25, 2.0, 1.5, 0.25, 0.5, -2.0, 1.0], 2, 4),
    "b": tensor([1.0, 0.5, -3.0, 40.0, -0.75, 0.5, -1.0, 1.0], 2, 4),
}
write("math_reference.txt", matrices, [
    ("diagonal", ["m"], lambda m: torch.diagonal(m, 1, 1, 2)),
    ("diagonal_below", ["m"], lambda m: torch.diagonal(m, -1, 2, 0)),
    ("trace", ["m"], lambda m: torch.trace(m[1])),
    ("diag_vector", ["v"], lambda v: torch.diag(v, -1)),
    ("diag_matrix", ["m"], lambda m: torch.diag(m[0], 2)),
    ("outer", ["v", "w"], torch.outer),
    ("kron", ["a", "v"], lambda a, v: torch.kron(a, v.reshape(3, 1))),
    ("diff", ["m"], lambda m: torch.diff(m, 2, 1)),
    ("logaddexp", ["a", "b"], torch.logaddexp),
])

# ties (row 0 of r) and NaN (row 1) for the running extremes; a row whose small terms a shift
# by its largest would lose, for logcumsumexp
nan = float("nan")
more = {
    "m": matrices["m"],
    "n": torch.arange(3 * 4 * 5, dtype=torch.float64).reshape(3, 4, 5) * 0.29 % 1.7 - 0.9,
    "r": tensor([1, 3, 3, -2, 3, 0.5, 2, nan, 1, nan, 4, 0.25], 2, 6),
    "wide": tensor([-1000, 1, -1000, 3, 2, -5, 700], 7),
    "p": tensor([1, -2, 0.5, 3, 0.25, -1, 2, 2, 1.5, -0.5, 1, 4], 4, 3),
    "q": tensor([0.5, 1, -1, -2, 3, 0.75, 1, -1, 2, 0.25, 0.5, -3], 4, 3),
    "a": tensor([3, -4, 0, 1e200, -0.0, 2.5, -1e-200, 0.5], 2, 4),
    "b": tensor([4, 3, -2, 1e200, -1, -0.0, 1e-200, 0], 2, 4),
    "v": matrices["v"],
    "w": matrices["w"],
    "weights": tensor([0.5, 1.5, -2, 0.25, 3, 1], 6),
}
ids = torch.tensor([2, 0, 2, 5, 1, 2])
spread = tensor([0, 0.5, 1, 1.25, 2.5, 3, 3.5, 4, -1, 5, 2, 2], 12)
write("math_more_reference.txt", more, [
    ("cummax", ["m"], lambda m: torch.cummax(m, 1).values),
    ("cummin", ["m"], lambda m: torch.cummin(m, 2).values),
    ("cummax_ties_nan", ["r"], lambda r: torch.cummax(r, 1).values),
    ("cummax_ties_nan_indices", [], lambda: torch.cummax(more["r"], 1).indices),
    ("cummin_ties_nan_indices", [], lambda: torch.cummin(more["r"], 1).indices),
    ("logcumsumexp", ["m"], lambda m: torch.logcumsumexp(m, 2)),
    ("logcumsumexp_wide", ["wide"], lambda x: torch.logcumsumexp(x, 0)),
    ("median", ["n"], lambda n: torch.median(n, 1).values),
    ("median_indices", [], lambda: torch.median(more["n"], 2).indices),
    ("median_all", ["n"], torch.median),
    ("median_nan", ["r"], lambda r: torch.median(r, 1, keepdim=True).values),
    ("kthvalue", ["n"], lambda n: torch.kthvalue(n, 2, 0).values),
    ("quantile_linear", ["n"], lambda n: torch.quantile(n, tensor([0.1, 0.5, 0.8], 3), 2)),
    ("quantile_lower", ["n"],
     lambda n: torch.quantile(n, 0.4, 1, keepdim=True, interpolation="lower")),
    ("quantile_higher", ["n"], lambda n: torch.quantile(n, 0.4, 1, interpolation="higher")),
    ("quantile_midpoint", ["n"], lambda n: torch.quantile(n, 0.4, 0, interpolation="midpoint")),
    ("quantile_nearest", ["m"],
     lambda m: torch.quantile(m, tensor([0.375, 0.625], 2), 2, interpolation="nearest")),
    ("quantile_all", ["n"], lambda n: torch.quantile(n, 0.3)),
    ("quantile_all_keepdim", ["n"],
     lambda n: torch.quantile(n, tensor([0.3, 0.9], 2), keepdim=True)),
    ("quantile_nan", ["r"], lambda r: torch.quantile(r, 0.5, 1)),
    ("tensordot", ["m", "n"], lambda m, n: torch.tensordot(m, n, 2)),
    ("tensordot_axes", ["m", "n"], lambda m, n: torch.tensordot(m, n, ([2, 1], [1, 0]))),
    ("tensordot_one", ["m", "n"], lambda m, n: torch.tensordot(m, n, ([1], [0]))),
    ("tensordot_outer", ["v", "w"], lambda v, w: torch.tensordot(v, w, 0)),
    ("cross", ["p", "q"], lambda p, q: torch.linalg.cross(p, q)),
    ("cross_axis_0", ["p", "q"], lambda p, q: torch.linalg.cross(p.t(), q[:1].t(), dim=0)),
    ("hypot", ["a", "b"], torch.hypot),
    ("copysign", ["a", "b"], torch.copysign),
    ("sinc", ["a"], lambda a: torch.sinc(a / 1e200 * 3)),
    ("sinc_small", ["p"], torch.sinc),
    ("bincount_weights", [], lambda: torch.bincount(ids, more["weights"], 8)),
    ("histc", [], lambda: torch.histc(spread, 4, 0, 4)),
    ("histc_own_range", [], lambda: torch.histc(spread[:10], 5)),
    ("rot90", ["m"], lambda m: torch.rot90(m, 1, [1, 2])),
    ("rot90_back", ["m"], lambda m: torch.rot90(m, -1, [2, 0])),
    ("rot90_twice", ["m"], lambda m: torch.rot90(m, 2, [0, 1])),
    ("block_diag", ["p", "v", "w"], lambda p, v, w: torch.block_diag(p, v, w[0])),
    ("cartesian_prod", ["v", "w"], torch.cartesian_prod),
    ("meshgrid_xy", ["v", "w"], lambda v, w: torch.stack(torch.meshgrid(v, w, indexing="xy"))),
])

# Scatters along axis 1 of base [3, 5] from src [4, 6] at index [2, 4] (row 2 untouched): ties
# with base at place 0 of row 0 (1.5) and place 4 of row 1 (3), and a 0 for prod's gradient
scatter_inputs = {
    "base": tensor([1.5, 0, 2, -1, 7, 1, 2, 3, 4, 3, 5, 6, 7, 8, 9], 3, 5),
    "src": tensor([1.5, -2, 1.5, 0.25, 9, 9, 3, -1, 0, 3, 9, 9,
                   9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], 4, 6),
    "slices": tensor([0.5, -1, 2, 4, 0.25, -3], 3, 2),
}
scatter_index = torch.tensor([[0, 1, 0, 3], [4, 4, 2, 4]])
unique_index = torch.tensor([[0, 1, 4, 3], [4, 1, 2, 0]])
slice_index = torch.tensor([3, 0])
scatter_cases = [
    # src cut to index's shape (the tests pass it whole): PyTorch 1.13's gradient of a larger
    # src fails
    ("scatter", ["base", "src"], lambda b, s: b.scatter(1, unique_index, s[:2, :4])),
    ("scatter_repeated", [], lambda: scatter_inputs["base"].scatter(
        1, scatter_index, scatter_inputs["src"])),
    ("scatter_value", ["base"], lambda b: b.scatter(1, scatter_index, -4.5)),
    ("index_copy", ["base", "slices"], lambda b, s: b.index_copy(1, slice_index, s)),
    ("index_fill", ["base"], lambda b: b.index_fill(1, slice_index, 2.5)),
]
# Without self, base is moved 0.5 off its ties with src: PyTorch 1.13 still counts them in the
# shares of src's gradient (which then add up to less than the whole)
for reduce in ["sum", "mean", "amax", "amin", "prod"]:
    for include_self in [True, False]:
        scatter_cases.append(("scatter_reduce_%s_%s" % (reduce, "self" if include_self else "src"),
                              ["base", "src"],
                              lambda b, s, r=reduce, i=include_self:
                              (b if i else b + 0.5).scatter_reduce(1, scatter_index, s[:2, :4], r,
                                                                   include_self=i)))
scatter_cases.append(("index_reduce_amax", ["base", "slices"],
                      lambda b, s: b.index_reduce(1, torch.tensor([3, 3]), s, "amax")))
scatter_cases.append(("scatter_reduce_mean_int", [], lambda: torch.tensor(
    [[10, 20, 30, 40]]).scatter_reduce(1, torch.tensor([[0, 0, 1, 1, 1]]),
                                       torch.tensor([[1, 2, 3, 4, -8]]), "mean",
                                       include_self=False)))
# max_pool's indices (a tie in the first window) and max_unpool of values at them
image = (torch.arange(2 * 2 * 7 * 6, dtype=torch.float64).reshape(2, 2, 7, 6) * 0.37 % 2.3) - 1.1
image[0, 0, 1, 1] = image[0, 0, 1, 2]
scatter_inputs["image"] = image
scatter_inputs["pooled"] = torch.arange(2 * 2 * 3 * 3, dtype=torch.float64).reshape(
    2, 2, 3, 3) * 0.25 - 2
scatter_inputs["pooled_wide"] = torch.arange(2 * 2 * 4 * 4, dtype=torch.float64).reshape(
    2, 2, 4, 4) * 0.125 - 3
volume = image.reshape(1, 2, 7, 6, 2)
scatter_cases += [
    ("max_pool2d_indices", [], lambda: F.max_pool2d(image, 3, 2, 1, return_indices=True)[1]),
    ("max_pool2d_indices_ceil", [], lambda: F.max_pool2d(
        image, 2, (2, 3), 0, ceil_mode=True, return_indices=True)[1]),
    ("max_pool1d_indices_dilated", [], lambda: F.max_pool1d(
        image.reshape(2, 2, 42), 3, 2, 1, 2, return_indices=True)[1]),
    ("max_pool3d_indices", [], lambda: F.max_pool3d(volume, 2, (2, 2, 1), (1, 0, 0),
                                                     return_indices=True)[1]),
    ("max_unpool2d", ["pooled"], lambda p: F.max_unpool2d(
        p, F.max_pool2d(image, 2, 2, return_indices=True)[1], 2, 2, output_size=(7, 6))),
    ("max_unpool2d_padded", ["pooled_wide"], lambda p: F.max_unpool2d(
        p, F.max_pool2d(image, 2, 2, 1, return_indices=True)[1], 2, 2, 1, output_size=(7, 6))),
]
write("scatter_reference.txt", scatter_inputs, scatter_cases)

# Matrices: a needs a row swap at its first step (a zero in its corner), batch holds two 3 x 3
# (one of negative determinant), spd a symmetric positive definite pair
linalg_inputs = {
    "a": tensor([0, 2, 1, -1, 3, 1, 0.5, 4, 2, 1, -1, 3, 1.5, 0.25, 2, -2], 4, 4),
    "batch": tensor([2, -1, 0.5, 1, 3, 1, 0.25, -2, 4, 0, 1, 4, 1, 2, 3, 2, 0.5, 1], 2, 3, 3),
    "rhs": tensor([1, -2, 0.5, 3, 2, 1, -1, 0.25], 4, 2),
    "vec": tensor([1, -1, 2], 3),
    "spd": tensor([4, 1, 0.5, 1, 3, -0.5, 0.5, -0.5, 2, 2, -1, 0, -1, 5, 1, 0, 1, 3], 2, 3, 3),
    "tall": tensor([1, 2, -1, 0.5, 3, 1, 2, -2, 0.25, 1, 1, 4, -3, 0.5, 2], 5, 3),
    "upper": tensor([-2, 1, 3, 0, 0.5, -1, 0, 0, -4], 3, 3),
    "probabilities": tensor([-0.999, -0.9, -0.5, -0.1, 0, 1e-5, 0.3, 0.7, 0.95, 0.9999], 10),
    "symmetric5": tensor([2, 1, -0.5, 0.25, 1, 1, -3, 0.5, 2, -1, -0.5, 0.5, 4, 1.5, 0.75, 0.25, 2,
                          1.5, -1, -2, 1, -1, 0.75, -2, 0.5], 5, 5),
}


def flat_eigh(s, uplo):
    values, vectors = torch.linalg.eigh(s, uplo)
    return torch.cat([values.flatten(), (vectors * vectors.sum(-2, keepdim=True).sign()).flatten()])


def flat_svd(a):
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    sign = vh.sum(-1, keepdim=True).sign()
    return torch.cat([(u * sign.mT).flatten(), s.flatten(), (vh * sign).flatten()])


def rank_1():   # vec's first two entries times themselves
    v = linalg_inputs["vec"][:2]
    return torch.outer(v, v)


write("linalg_reference.txt", linalg_inputs, [
    ("det", ["a"], torch.linalg.det),
    ("det_batch", ["batch"], torch.linalg.det),
    ("slogdet_sign", [], lambda: torch.linalg.slogdet(linalg_inputs["batch"])[0]),
    ("slogdet_logabs", ["batch"], lambda b: torch.linalg.slogdet(b)[1]),
    ("inv", ["a"], torch.linalg.inv),
    ("inv_batch", ["batch"], torch.linalg.inv),
    ("solve", ["a", "rhs"], torch.linalg.solve),
    ("solve_vector", ["batch", "vec"], torch.linalg.solve),
    ("cholesky", ["spd"], torch.linalg.cholesky),
    ("cholesky_upper", ["spd"], lambda x: torch.linalg.cholesky(x, upper=True)),
    ("vector_norm_3", ["batch"], lambda b: torch.linalg.vector_norm(b, 3, (1, 2))),
    ("vector_norm_0", [], lambda: torch.linalg.vector_norm(linalg_inputs["a"], 0)),
    ("vector_norm_neg_inf", ["a"], lambda a: torch.linalg.vector_norm(a + 5, -float("inf"), 1)),
    ("vector_norm_neg", ["rhs"], lambda r: torch.linalg.vector_norm(r, -1.5, 0)),
    ("matrix_norm_fro", ["batch"], torch.linalg.matrix_norm),
    ("matrix_norm_1", ["batch"], lambda b: torch.linalg.matrix_norm(b, 1)),
    ("matrix_norm_inf", ["a"], lambda a: torch.linalg.matrix_norm(a, float("inf"))),
    ("matrix_norm_neg_1", ["batch"], lambda b: torch.linalg.matrix_norm(b, -1, keepdim=True)),
    ("qr_q", ["tall"], lambda a: torch.linalg.qr(a)[0]),
    ("qr_r", ["tall"], lambda a: torch.linalg.qr(a)[1]),
    ("qr_square_q", ["batch"], lambda a: torch.linalg.qr(a)[0]),
    ("qr_square_r", ["batch"], lambda a: torch.linalg.qr(a)[1]),
    ("qr_complete_q", [], lambda: torch.linalg.qr(linalg_inputs["tall"], "complete")[0]),
    ("qr_complete_r", [], lambda: torch.linalg.qr(linalg_inputs["tall"], "complete")[1]),
    ("qr_wide_q", [], lambda: torch.linalg.qr(linalg_inputs["tall"].t())[0]),
    ("qr_wide_r", [], lambda: torch.linalg.qr(linalg_inputs["tall"].t())[1]),
    ("qr_upper_q", [], lambda: torch.linalg.qr(linalg_inputs["upper"])[0]),
    ("qr_upper_r", [], lambda: torch.linalg.qr(linalg_inputs["upper"])[1]),
    ("erfinv", ["probabilities"], torch.erfinv),
    ("solve_triangular_upper", ["upper", "rhs"],
     lambda u, r: torch.linalg.solve_triangular(u, r[:3], upper=True)),
    ("solve_triangular_lower_right", ["spd", "rhs"], lambda s, r: torch.linalg.solve_triangular(
        s[0].tril(), r[:3].t(), upper=False, left=False)),
    ("solve_triangular_unit", ["a", "rhs"], lambda a, r: torch.linalg.solve_triangular(
        a, r, upper=False, unitriangular=True)),
    ("lstsq_tall", ["tall", "rhs"], lambda a, r: torch.linalg.lstsq(
        a, torch.cat([r, r[:1]]), driver="gels").solution),
    ("lstsq_wide", ["tall", "rhs"], lambda a, r: torch.linalg.lstsq(
        a.t(), r[:3], driver="gels").solution),
    ("matrix_power_5", ["batch"], lambda b: torch.linalg.matrix_power(b, 5)),
    ("matrix_power_neg_2", ["a"], lambda a: torch.linalg.matrix_power(a, -2)),
    ("multi_dot", ["vec", "batch", "spd"], lambda v, b, s: torch.linalg.multi_dot(
        [v, b[0], s[1], b[1]])),
    ("cov", ["tall"], lambda t: torch.cov(t.t())),
    ("cov_vector", ["vec"], lambda v: torch.cov(v, correction=0)),
    ("corrcoef", ["tall"], lambda t: torch.corrcoef(t.t())),
    # Eigenvalues and eigenvectors, singular values and vectors, as one flat case each (the
    # vectors' signs turned to make each column's sum positive, each of Vh's rows', as theirs
    # and ours may differ in sign); gradients of three (each a long program of rotations)
    ("eigh", ["spd"], lambda s: flat_eigh(s, "L")),
    ("eigh_odd_upper", [], lambda: flat_eigh(linalg_inputs["symmetric5"], "U")),
    ("eigvalsh", [], lambda: torch.linalg.eigvalsh(linalg_inputs["a"])),
    ("svd", ["tall"], lambda t: flat_svd(t)),
    ("svd_wide", [], lambda: flat_svd(linalg_inputs["tall"].t())),
    # (the rest on matrices of two columns or rows: a sweep of one round)
    ("svdvals", [], lambda: torch.linalg.svdvals(linalg_inputs["rhs"])),
    ("pinv", ["tall"], torch.linalg.pinv),
    ("pinv_rank_1", [], lambda: torch.linalg.pinv(rank_1())),
    ("matrix_rank", [], lambda: torch.linalg.matrix_rank(rank_1())),
    ("matrix_rank_atol", [], lambda: torch.linalg.matrix_rank(linalg_inputs["rhs"], atol=2.5)),
    ("matrix_norm_2", [], lambda: torch.linalg.matrix_norm(linalg_inputs["rhs"], 2)),
    ("matrix_norm_neg_2", [], lambda: torch.linalg.matrix_norm(linalg_inputs["rhs"].t(), -2,
                                                               keepdim=True)),
    ("matrix_norm_nuc", [], lambda: torch.linalg.matrix_norm(linalg_inputs["rhs"], "nuc")),
    ("cond", [], lambda: torch.linalg.cond(linalg_inputs["rhs"][:2])),
    # (without gradients: PyTorch 1.13's cond 1 and "fro" fail theirs, an inverse changed in place)
    ("cond_1", [], lambda: torch.linalg.cond(linalg_inputs["batch"], 1)),
    ("cond_fro", [], lambda: torch.linalg.cond(linalg_inputs["a"], "fro")),
    # LU with partial pivoting (a's first pivot is 0), rectangular both ways, singular (as
    # lu_factor_ex: lu_factor raises there), and lu_solve's four ways
    ("lu_factor", ["a"], lambda a: torch.linalg.lu_factor(a).LU),
    ("lu_factor_pivots", [], lambda: torch.linalg.lu_factor(linalg_inputs["batch"]).pivots),
    ("lu_tall_l", ["tall"], lambda t: torch.linalg.lu(t).L),
    ("lu_tall_u", ["tall"], lambda t: torch.linalg.lu(t).U),
    ("lu_tall_p", [], lambda: torch.linalg.lu(linalg_inputs["tall"]).P),
    ("lu_wide", ["tall"], lambda t: torch.cat([torch.linalg.lu(t.t()).L.flatten(),
                                                torch.linalg.lu(t.t()).U.flatten()])),
    ("lu_singular", [], lambda: torch.linalg.lu_factor_ex(
        tensor([1, 2, 3, 2, 4, 6, 1, 0, 1], 3, 3)).LU),
    ("lu_solve", ["a", "rhs"], lambda a, r: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), r)),
    ("lu_solve_adjoint", ["batch", "rhs"],
     lambda b, r: torch.linalg.lu_solve(*torch.linalg.lu_factor(b), r[:3], adjoint=True)),
    ("lu_solve_right", ["a", "rhs"],
     lambda a, r: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), r.t(), left=False)),
    ("lu_solve_right_adjoint", ["a", "rhs"], lambda a, r: torch.linalg.lu_solve(
        *torch.linalg.lu_factor(a), r.t(), left=False, adjoint=True)),
    # matrix_exp: norms from 0.4 to 14 in a batch (0 to 2 squarings), and a larger one
    ("matrix_exp", ["batch"], lambda b: torch.linalg.matrix_exp(
        torch.stack([b[0] * 0.1, b[1]]))),
    ("matrix_exp_large", ["a"], lambda a: torch.linalg.matrix_exp(a * 3)),
    ("matrix_exp_skew", [], lambda: torch.linalg.matrix_exp(
        linalg_inputs["a"] - linalg_inputs["a"].t())),
])

# grid_sample of x [2, 2, 4, 5] at grid [2, 3, 3, 2]: points inside, on the edges and outside
torch.manual_seed(3)
sampling = {
    "x": torch.randn(2, 2, 4, 5, dtype=torch.float64),
    "grid": torch.rand(2, 3, 3, 2, dtype=torch.float64) * 2.8 - 1.4,
    "theta": tensor([1, 0.2, -0.1, -0.3, 0.9, 0.25, 0.5, -1, 0, 1.5, 0.1, -0.5], 2, 2, 3),
}
sampling["grid"][0, 0, 0] = torch.tensor([1.0, -1.0])
sampling["grid"][0, 0, 1] = torch.tensor([0.0, 0.0])
sampling_cases = [
    ("affine_grid", ["theta"], lambda t: F.affine_grid(t, [2, 1, 3, 4], align_corners=False)),
    ("affine_grid_corners", ["theta"], lambda t: F.affine_grid(t, [2, 1, 3, 4],
                                                               align_corners=True)),
]
for mode in ["bilinear", "nearest"]:
    for padding_mode in ["zeros", "border", "reflection"]:
        for align_corners in [False, True]:
            sampling_cases.append((
                "grid_sample_%s_%s_%s" % (mode, padding_mode,
                                          "corners" if align_corners else "edges"),
                ["x", "grid"], lambda x, g, m=mode, p=padding_mode, a=align_corners:
                F.grid_sample(x, g, m, p, a)))
write("sampling_reference.txt", sampling, sampling_cases)

# A post-norm encoder (ReLU) with a final LayerNorm and a pre-norm decoder (GELU), two layers
# each, made as PyTorch makes them (each layer a copy of the one given), then every weight
# moved by noise so that the layers differ; dropout 0, in float64 from float32 weights
torch.manual_seed(0)
E, HEADS, FF, N, S, T = 8, 2, 16, 2, 5, 4
encoder = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(E, HEADS, FF, 0.0, batch_first=True), 2,
    norm=torch.nn.LayerNorm(E))
decoder = torch.nn.TransformerDecoder(
    torch.nn.TransformerDecoderLayer(E, HEADS, FF, 0.0, activation="gelu", batch_first=True,
                                     norm_first=True), 2)
weights = {}
with torch.no_grad():
    for prefix, model in (("encoder.", encoder), ("decoder.", decoder)):
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape) * 0.1)
            weights[prefix + name] = p.detach().double()
        model.double()
inputs = dict(weights)
inputs["src"] = torch.randn(N, S, E, dtype=torch.float64)
inputs["tgt"] = torch.randn(N, T, E, dtype=torch.float64)
padding = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
inputs["src_key_padding_mask"] = padding.double()   # 1: a padded position, not attended to


def encode(src):
    return encoder(src, src_key_padding_mask=padding)


def decode(src, tgt):
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    return decoder(tgt, encode(src), tgt_mask=causal, memory_key_padding_mask=padding)


# A whole nn.Transformer (one layer each way), its weights moved by noise as above
transformer = torch.nn.Transformer(E, HEADS, 1, 1, FF, 0.0, batch_first=True)
with torch.no_grad():
    for name, p in transformer.named_parameters():
        p.add_(torch.randn(p.shape) * 0.1)
        inputs["transformer." + name] = p.detach().double()
    transformer.double()


def transform(src, tgt):
    subsequent = torch.nn.Transformer.generate_square_subsequent_mask(T).double()
    return transformer(src, tgt, tgt_mask=subsequent, src_key_padding_mask=padding,
                       memory_key_padding_mask=padding)


write("transformer_reference.txt", inputs, [
    ("encoder", ["src"], encode),
    ("decoder", ["src", "tgt"], decode),
    ("transformer", ["src", "tgt"], transform),
])

gamma_points = tensor([-2.5, -0.5, -1.25, -7.75, 0.3, 0.5, 1.0, 2.0, 3.7, 7.3, 25.0, 150.0, 1e-3,
                       5.999, 6.0], 15)
with_nan = tensor([1.5, float("nan"), -2, 0.25, float("nan"), float("nan"), 3, 4, -1], 3, 3)
targets = torch.tensor([[3, 0, -1, 1], [1, 2, 3, 0], [2, -1, 0, 0]])
write("special_reference.txt", {
    "g": gamma_points,
    "nan": with_nan,
    "m": more["m"],
    "y": tensor([1, 2.5, 4, 3.5, -1, 0, 2, 2.25], 2, 4),
    "t": tensor([0, 0.5, 2, 2.25], 4),
    "ts": tensor([0, 1, 1.5, 3, 0, 0.25, 0.75, 2], 2, 4),
    "e": tensor([1, -2, 0, 3, 10, -1, 2, 0.5], 2, 4),
    "s": tensor([-1, 0, 0.5, 2, 0, -0.0, 3, 0], 2, 4),
    "h": tensor([0.25, 0.5, 0.75, 1], 4),
    "rows": tensor([1, 2, -1, 0.5, 3, 1, 0, 0, 2, -2, 1, 4, 1.5, -0.5, 0, 2], 4, 4),
    "scores": tensor([0.1, 0.2, 0.4, 0.8, -1, 0.5, 0.3, 2, 1, -0.5, 0.25, 0.7], 3, 4),
}, [
    ("lgamma", ["g"], torch.lgamma),
    ("digamma", ["g"], torch.digamma),
    ("polygamma_1", ["g"], lambda g: torch.polygamma(1, g)),
    ("polygamma_2", ["g"], lambda g: torch.polygamma(2, g)),
    ("polygamma_3", ["g"], lambda g: torch.polygamma(3, g)),
    ("nansum", ["nan"], torch.nansum),
    ("nansum_axis", ["nan"], lambda x: torch.nansum(x, 1, keepdim=True)),
    ("nanmean_axis", ["nan"], lambda x: torch.nanmean(x, 0)),
    ("aminmax_min", [], lambda: torch.aminmax(with_nan, dim=1).min),
    ("aminmax_max", [], lambda: torch.aminmax(more["m"], dim=2, keepdim=True).max),
    ("aminmax_all", [], lambda: torch.stack(torch.aminmax(more["m"]))),
    ("heaviside", [], lambda: torch.heaviside(tensor([-1, 0, 2, -0.0, 3, 0], 2, 3),
                                              tensor([0.5, 0.25, 7], 3))),
    ("ldexp", ["y", "e"], torch.ldexp),
    ("trapezoid", ["y"], lambda y: torch.trapezoid(y, dx=0.5)),
    ("trapezoid_x", ["y", "t"], lambda y, t: torch.trapezoid(y, t)),
    ("trapezoid_xs_axis_0", ["y", "ts"], lambda y, t: torch.trapezoid(y, t, dim=0)),
    ("cumulative_trapezoid", ["y", "t"], lambda y, t: torch.cumulative_trapezoid(y, t)),
    ("cumulative_trapezoid_dx", ["y"], lambda y: torch.cumulative_trapezoid(y, dx=2, dim=0)),
    ("renorm", ["m"], lambda m: torch.renorm(m, 2, 0, 3)),
    ("renorm_1", ["m"], lambda m: torch.renorm(m, 1, 2, 2)),
    ("pdist", ["rows"], torch.pdist),
    ("pdist_1", ["rows"], lambda r: torch.pdist(r, 1)),
    ("pdist_3", ["rows"], lambda r: torch.pdist(r, 3)),
    # values alone: PyTorch 1.13's vander has no gradient (an in-place cumprod)
    ("vander", [], lambda: torch.vander(tensor([2, -1, 0.5, 3], 4))),
    ("vander_increasing", [], lambda: torch.vander(tensor([2, -1, 0.5, 3], 4), 6, increasing=True)),
    ("vecdot", ["y", "e"], lambda a, b: torch.linalg.vecdot(a, b)),
    ("vecdot_axis_0", ["y", "t"], lambda a, b: torch.linalg.vecdot(a, b.reshape(1, 4), dim=0)),
    ("multilabel_margin_loss", ["scores"], lambda x: F.multilabel_margin_loss(x, targets)),
    ("multilabel_margin_loss_none", ["scores"],
     lambda x: F.multilabel_margin_loss(x, targets, reduction="none")),
    ("multilabel_margin_loss_one", ["h"],
     lambda x: F.multilabel_margin_loss(x, torch.tensor([2, 0, -1, 3]), reduction="sum")),
])

# ctc_loss of log_softmax(x) (T 6, N 3, C 5): the gradients of x, through log_softmax, are the
# ones to compare (PyTorch's gradient for log_probs themselves adds exp(log_probs))
ctc_padded = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 0, 0]])
ctc_end_to_end = torch.tensor([1, 2, 2, 3, 1, 4])
ctc_inputs, ctc_targets = torch.tensor([6, 5, 4]), torch.tensor([3, 2, 1])


def ctc(x, targets=ctc_padded, inputs=ctc_inputs, lengths=ctc_targets, **options):
    return F.ctc_loss(x.log_softmax(-1), targets, inputs, lengths, **options)


write("ctc_reference.txt", {
    "x": torch.arange(6 * 3 * 5, dtype=torch.float64).reshape(6, 3, 5) * 0.77 % 3.1 - 1.4,
}, [
    ("ctc_mean", ["x"], ctc),
    ("ctc_sum", ["x"], lambda x: ctc(x, reduction="sum")),
    ("ctc_none", ["x"], lambda x: ctc(x, reduction="none")),
    ("ctc_end_to_end", ["x"], lambda x: ctc(x, ctc_end_to_end)),
    ("ctc_blank_4", ["x"], lambda x: ctc(x, ctc_padded % 4, blank=4, reduction="none")),
    ("ctc_repeats", ["x"],
     lambda x: ctc(x, torch.tensor([[1, 1, 1], [2, 2, 0], [3, 3, 3]]), torch.tensor([6, 6, 5]),
                   torch.tensor([3, 2, 1]), reduction="none")),
    ("ctc_unbatched", ["x"],
     lambda x: ctc(x[:, 1], torch.tensor([3, 1]), torch.tensor(5), torch.tensor(2))),
    # sample 0 needs 5 steps for 1, 1, 1 and has 4: its loss and gradient 0
    ("ctc_zero_infinity", ["x"],
     lambda x: ctc(x, torch.tensor([[1, 1, 1], [2, 2, 0], [4, 0, 0]]), torch.tensor([4, 6, 6]),
                   torch.tensor([3, 2, 0]), reduction="none", zero_infinity=True)),
])

# weight_norm (PyTorch's math, torch._weight_norm) and spectral_norm's parametrization with
# given starting vectors u0, v0, one power iteration while training, none in eval
def spectral(w, u0, v0, dim=0, training=True):
    sn = torch.nn.utils.parametrizations._SpectralNorm(w.detach(), 1, dim, 1e-12)
    with torch.no_grad():
        sn._u.copy_(u0)
        sn._v.copy_(v0)
    sn.train(training)
    return sn(w), sn


def spectral_vectors(w, u0, v0, dim=0):
    _, sn = spectral(w, u0, v0, dim)
    return torch.cat([sn._u, sn._v])


def unit(t):
    return t / t.norm()


norm_inputs = {
    "v": tensor([0.5, -1, 2, 1.5, 0.25, -0.75], 2, 3),
    "g": tensor([1.5, -0.5], 2, 1),
    "b": tensor([0.1, -0.2], 2),
    "x": tensor([1, 2, -1, 0.5, 0, 3, -2, 1, 1.5], 3, 3),
    "cv": torch.arange(4 * 2 * 3, dtype=torch.float64).reshape(4, 2, 3) * 0.37 % 1.3 - 0.6,
    "cx": torch.arange(2 * 2 * 6, dtype=torch.float64).reshape(2, 2, 6) * 0.53 % 1.7 - 0.8,
    "cb": tensor([0.2, -0.1, 0.05, 0.3], 4),
    "u0": unit(tensor([1, -2, 0.5, 1], 4)),
    "v0": unit(tensor([0.5, 1, -1, 2, 0.25, -0.5], 6)),
    "w4": tensor([0.5, -1, 2, 1.5, 0.25, -0.75, 1, 0, -0.5, 2, 1, -1.5], 4, 3),
    "u2": unit(tensor([1, -2], 2)),
    "v12": unit(torch.arange(12, dtype=torch.float64) % 5 - 2),
}
ni = norm_inputs
write("parametrization_reference.txt", norm_inputs, [
    ("weight_norm_linear", ["v", "g", "b", "x"],
     lambda v, g, b, x: F.linear(x, torch._weight_norm(v, g, 0), b)),
    ("weight_norm_conv1d_all", ["cv", "cb", "cx"],
     lambda v, b, x: F.conv1d(x, torch._weight_norm(v, v.norm().detach() * 0.5, -1), b)),
    ("weight_norm_conv1d_dim_1", ["cv", "cx"],
     lambda v, x: F.conv1d(x, torch._weight_norm(v, torch._weight_norm(v, v.norm(dim=(0, 2), keepdim=True), 1).norm(dim=(0, 2), keepdim=True).detach(), 1))),
    ("spectral_norm_linear", ["w4", "x"],
     lambda w, x: F.linear(x, spectral(w, ni["u0"], ni["v0"][:3] / ni["v0"][:3].norm())[0])),
    ("spectral_norm_linear_vectors", [],
     lambda: spectral_vectors(ni["w4"], ni["u0"], ni["v0"][:3] / ni["v0"][:3].norm())),
    ("spectral_norm_linear_eval", ["w4", "x"],
     lambda w, x: F.linear(x, spectral(w, ni["u0"], ni["v0"][:3] / ni["v0"][:3].norm(), 0,
                                       False)[0])),
    ("spectral_norm_conv1d", ["cv", "cx"],
     lambda w, x: F.conv1d(x, spectral(w, ni["u0"], ni["v0"])[0])),
    ("spectral_norm_conv_transpose1d", ["cv", "cb"],
     lambda w, x: F.conv_transpose1d(x.reshape(1, 4, 1).expand(1, 4, 3),
                                     spectral(w, ni["u2"], ni["v12"], 1)[0])),
    ("spectral_norm_conv_transpose1d_vectors", [],
     lambda: spectral_vectors(ni["cv"], ni["u2"], ni["v12"], 1)),
])


# LBFGS on Rosenbrock's function of a [2] and b [1] together: each step's parameters and loss
def lbfgs_run(line_search_fn, steps=3, lr=1, history_size=100, max_iter=20):
    a = tensor([-1.5, 2.0], 2).requires_grad_()
    b = tensor([0.5], 1).requires_grad_()
    opt = torch.optim.LBFGS([a, b], lr=lr, history_size=history_size, max_iter=max_iter,
                            line_search_fn=line_search_fn)

    def closure():
        opt.zero_grad()
        x = torch.cat([a, b])
        loss = (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
        loss.backward()
        return loss

    rows = []
    for _ in range(steps):
        loss = opt.step(closure)
        state = opt.state[a]
        rows.append(torch.cat([a.detach(), b.detach(), loss.detach().reshape(1),
                               tensor([state["func_evals"], state["n_iter"]], 2)]))
    return torch.stack(rows)


write("lbfgs_reference.txt", {}, [
    ("lbfgs", [], lambda: lbfgs_run(None)),
    ("lbfgs_strong_wolfe", [], lambda: lbfgs_run("strong_wolfe")),
    ("lbfgs_strong_wolfe_short", [], lambda: lbfgs_run("strong_wolfe", 2, 0.5, 3, 10)),
])


inf = float("inf")
basics = {
    "p": tensor([1, 1.00001, inf, -inf, nan, 0, 1e-9, 2], 8),
    "q": tensor([1.000001, 1, inf, inf, nan, 1e-9, 0, 2.5], 8),
    "m": tensor([0.5, -1, 2, 1.5, 0.25, -0.75, 1, 3, -2, 0.5, 1.25, 2.5], 3, 4),
    "n": tensor([1, -0.5, 2, 0.25, 1.5, -1, 0.75, 2, -1.25, 0.5, 1, 3], 4, 3),
    "row": tensor([2, -1, 0.5], 3),
    "col": tensor([1, 0.5, -2, 1.5], 4),
    "batch": tensor([2, -1, 0.5, 1, 3, 1, 0.25, -2, 4, 0, 1, 4, 1, 2, 3, 2, 0.5, 1], 2, 3, 3),
    "t": tensor([-2.5, -0.5, 0, 0.75, 3.25, 370], 2, 3),
}
b_ = basics
write("basics_reference.txt", basics, [
    ("isclose", [], lambda: torch.isclose(b_["p"], b_["q"]).double()),
    ("isclose_nan", [], lambda: torch.isclose(b_["p"], b_["q"], 1e-3, 0, True).double()),
    ("isin", [], lambda: torch.isin(torch.tensor([[1, 5, 2], [7, 2, 0]]),
                                    torch.tensor([2, 7, 9])).double()),
    ("isin_invert", [], lambda: torch.isin(b_["t"], tensor([0, 370], 2), invert=True).double()),
    ("diag_embed", ["m"], torch.diag_embed),
    ("diag_embed_offset", ["m"], lambda x: torch.diag_embed(x, 1)),
    ("diag_embed_below_dims", ["m"], lambda x: torch.diag_embed(x, -2, 0, 2)),
    ("take_along_dim", ["m"], lambda x: torch.take_along_dim(
        x, torch.tensor([[3, 0], [1, 1], [2, 0]]), 1)),
    ("take_along_dim_broadcast", ["m"], lambda x: torch.take_along_dim(
        x, torch.tensor([[2, 0, 1, 1]]), 0)),
    ("take_along_dim_flat", ["m"], lambda x: torch.take_along_dim(x, torch.tensor([11, 0, 5]))),
    ("logdet", ["batch"], lambda x: torch.logdet(x @ x.mT + torch.eye(3))),
    ("logdet_signs", [], lambda: torch.logdet(b_["batch"])),
    ("addmm", ["row", "m", "n"], lambda r, a, b: torch.addmm(r, b, a[:, :3], beta=0.5, alpha=2)),
    ("addmm_beta_0", ["m", "n"], lambda a, b: torch.addmm(
        torch.full((4, 4), nan, dtype=torch.float64), b, a, beta=0)),
    ("addmv", ["col", "n", "row"], lambda c, a, r: torch.addmv(c, a, r, beta=-1, alpha=0.5)),
    ("addr", ["m", "row", "col"], lambda a, r, c: torch.addr(a[:, :3].t(), r, c[:3] * 2, alpha=3)),
    ("baddbmm", ["batch"], lambda x: torch.baddbmm(x, x, x.mT, beta=2, alpha=0.25)),
    ("addbmm", ["batch", "m"], lambda x, a: torch.addbmm(a[:, :3], x, x)),
    ("addcmul", ["m", "n"], lambda a, b: torch.addcmul(a, a, b.t(), value=0.5)),
    ("addcdiv", ["m", "col"], lambda a, c: torch.addcdiv(a, a, c + 3, value=-2)),
    ("hstack", ["m", "n"], lambda a, b: torch.hstack([a, b.t(), a[:, :1]])),
    ("hstack_1d", ["row", "col"], lambda r, c: torch.hstack([r, c])),
    ("vstack", ["row", "m"], lambda r, a: torch.vstack([a[:, :3], r])),
    ("dstack", ["row", "m"], lambda r, a: torch.dstack([r, a[:1, :3]])),
    ("column_stack", ["row", "m"], lambda r, a: torch.column_stack([r, a[:, :2], r])),
    ("atleast_3d", ["m"], torch.atleast_3d),
    ("float_power", ["m", "n"], lambda a, b: torch.float_power(a.abs(), b.t())),
    ("float_power_int", [], lambda: torch.float_power(torch.tensor([2, 3, -2]),
                                                      torch.tensor([3, -1, 2]))),
    ("logaddexp2", ["m", "n"], lambda a, b: torch.logaddexp2(a, b.t())),
    ("frac", ["t"], torch.frac),
    ("deg2rad", ["t"], torch.deg2rad),
    ("rad2deg", ["t"], torch.rad2deg),
    ("count_nonzero", [], lambda: torch.count_nonzero(torch.tensor([[0, 1, 2], [0, 0, 3]]), 1)
     .double()),
    ("tile", ["m"], lambda x: x.tile((2,))),
    ("tile_more", ["row"], lambda x: x.tile((2, 1, 2))),
    ("repeat_interleave", ["m"], lambda x: x.repeat_interleave(2, 0)),
    ("repeat_interleave_flat", ["row"], lambda x: x.repeat_interleave(3)),
    ("take", ["m"], lambda x: x.take(torch.tensor([[11, 0], [4, 4]]))),
    ("masked_scatter", ["m", "n"], lambda a, b: a.masked_scatter(
        torch.tensor([[True, False, True, False]]), b)),
    ("narrow", ["m"], lambda x: x.narrow(1, -3, 2)),
    ("unbind", ["m"], lambda x: torch.stack(list(x.unbind(1))[::-1])),
])


names = {
    "w": tensor([1.5, nan, -2, 0.25, nan, nan, 3, 4, -1, 0.5, 2, -0.75, nan, nan, nan, nan], 4, 4),
    "m": basics["m"],
    "n": basics["n"],
    "row": basics["row"],
    "col": basics["col"],
    "batch": basics["batch"],
    "cube": torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) * 0.45 % 1.7 - 0.6,
    "ties": tensor([1, nan, 2, 2, -1, 3, nan, -1], 2, 4),
}
n_ = names
w_some = n_["w"][:3]   # rows with a number
spd = lambda x: x @ x.mT + torch.eye(3, dtype=torch.float64)
write("names_reference.txt", names, [
    ("nanmedian", ["w"], lambda x: x[:3].nanmedian(1).values),
    ("nanmedian_indices", [], lambda: w_some.nanmedian(1).indices.double()),
    ("nanmedian_all", ["w"], lambda x: x.nanmedian()),
    ("nanmedian_column", ["w"], lambda x: x[:, :3].nanmedian(0, keepdim=True).values),
    ("nanquantile_linear", ["w"], lambda x: torch.nanquantile(x[:3], tensor([0.1, 0.5, 0.8], 3), 1)),
    ("nanquantile_none_left", [], lambda: torch.nanquantile(n_["w"], 0.3, 1)),
    ("nanquantile_lower", ["w"], lambda x: torch.nanquantile(x[:3], 0.4, 1, True, interpolation="lower")),
    ("nanquantile_higher", ["w"], lambda x: torch.nanquantile(x[:3], 0.4, 1, interpolation="higher")),
    ("nanquantile_midpoint", ["w"], lambda x: torch.nanquantile(x[:3], 0.4, 1, interpolation="midpoint")),
    ("nanquantile_nearest", ["w"], lambda x: torch.nanquantile(x[:3], tensor([0.375, 0.625], 2), 1, interpolation="nearest")),
    ("nanquantile_all", ["w"], lambda x: torch.nanquantile(x, 0.3)),
    ("fmax", ["ties"], lambda x: torch.fmax(x, x.flip(1))),
    ("fmin", ["ties"], lambda x: torch.fmin(x, x.roll(1, 1))),
    ("gcd", [], lambda: torch.gcd(torch.tensor([12, -18, 0, 0, 1071, 2**31 - 1, 832040]),
                                  torch.tensor([8, 12, 5, 0, -462, 2**30, 514229])).double()),
    ("gcd_int64", [], lambda: torch.gcd(torch.tensor([2**62, 7540113804746346429]),
                                        torch.tensor([2**40 * 3, 4660046610375530309])).double()),
    ("lcm", [], lambda: torch.lcm(torch.tensor([4, -6, 0, 21]), torch.tensor([6, 4, 5, -6])).double()),
    ("mv", ["m", "col"], lambda a, v: torch.mv(a, v)),
    ("vdot", ["row", "col"], lambda a, b: torch.vdot(a, b[:3])),
    ("inner", ["m", "cube"], lambda a, b: torch.inner(a, b)),
    ("inner_scalar", ["row"], lambda a: torch.inner(a, torch.tensor(2.5, dtype=torch.float64))),
    ("ger", ["row", "col"], torch.ger),
    ("chain_matmul", ["m", "n"], lambda a, b: torch.chain_matmul(a, b, a)),
    ("dist", ["m", "n"], lambda a, b: torch.dist(a, b.t())),
    ("dist_1", ["m", "row"], lambda a, r: torch.dist(a[:, :3], r, 1)),
    ("dist_inf", ["m", "n"], lambda a, b: torch.dist(a, b.t(), float("inf"))),
    ("diagflat", ["m"], lambda a: torch.diagflat(a[:2, :2], -1)),
    ("std_mean", ["m"], lambda a: torch.stack(torch.std_mean(a, 1))),
    ("var_mean", ["cube"], lambda a: torch.stack(torch.var_mean(a, (0, 2), correction=0, keepdim=True))),
    ("std_mean_all", ["m"], lambda a: torch.stack(torch.std_mean(a))),
    ("cholesky_solve", ["batch", "m"], lambda x, b: torch.cholesky_solve(
        b[:, :2].expand(2, 3, 2), torch.linalg.cholesky(spd(x)))),
    ("cholesky_solve_upper", ["batch", "m"], lambda x, b: torch.cholesky_solve(
        b[:, 1:], torch.linalg.cholesky(spd(x[0]), upper=True), upper=True)),
    ("cholesky_inverse", ["batch"], lambda x: torch.cholesky_inverse(torch.linalg.cholesky(spd(x[1])))),
    ("cholesky_inverse_upper", ["batch"], lambda x: torch.cholesky_inverse(
        torch.linalg.cholesky(spd(x[0]), upper=True), upper=True)),
    ("msort", ["m"], torch.msort),
    ("hsplit", ["cube"], lambda x: torch.cat(torch.hsplit(x, [1, 2])[::-1], 1)),
    ("vsplit", ["m"], lambda x: torch.cat(torch.vsplit(x, 3)[::-1])),
    ("dsplit", ["cube"], lambda x: torch.cat(torch.dsplit(x, 2)[::-1], 2)),
    ("broadcast_tensors", ["row", "col"], lambda a, b: torch.stack(torch.broadcast_tensors(a, b[:, None]))),
    ("arctan2", ["m", "n"], lambda a, b: torch.arctan2(a, b.t())),
    ("slice_scatter", ["m", "n"], lambda a, b: torch.slice_scatter(a, b[:3, :2], 1, -3, 4, 2)),
    ("slice_scatter_rows", ["m", "n"], lambda a, b: torch.slice_scatter(a, b.t()[:2] * 2, 0, 1, 3, 1)),
    ("select_scatter", ["m", "col"], lambda a, c: torch.select_scatter(a.t(), c[:3], 0, -1)),
    ("diagonal_scatter", ["m", "row"], lambda a, r: torch.diagonal_scatter(a, r * 3, 1)),
    ("diagonal_scatter_below", ["m", "row"], lambda a, r: torch.diagonal_scatter(a, r[:2], -1)),
    ("diagonal_scatter_axes", ["cube", "m"], lambda x, a: torch.diagonal_scatter(
        x, a[:2, :3], 0, 2, 1)),
    ("index_put", ["m", "n"], lambda a, b: torch.index_put(
        a, (torch.tensor([0, 1, -1]), torch.tensor([[1], [3]])), b[:2])),
    ("index_put_rows", ["m", "row"], lambda a, r: torch.index_put(
        a.t(), (torch.tensor([3, 0]),), r)),
    ("index_put_accumulate", ["m", "col"], lambda a, c: torch.index_put(
        a, (torch.tensor([1, 1, 0, 1]), torch.tensor([2, 2, 0, 3])), c, accumulate=True)),
    ("unique_consecutive", [], lambda: torch.unique_consecutive(
        tensor([1, 1, 2, 2, 2, nan, nan, 1, 3, 3], 2, 5))),
    ("unique_consecutive_inverse", [], lambda: torch.unique_consecutive(
        tensor([1, 1, 2, 2, 2, nan, nan, 1, 3, 3], 2, 5), return_inverse=True)[1].double()),
    ("tensorinv", ["m"], lambda a: torch.linalg.tensorinv(
        (a.t() @ a + torch.eye(4, dtype=torch.float64)).reshape(2, 2, 4))),
    ("tensorinv_ind_1", ["m"], lambda a: torch.linalg.tensorinv(
        (a.t() @ a + torch.eye(4, dtype=torch.float64)).reshape(4, 2, 2), ind=1)),
    ("tensorsolve", ["m", "col"], lambda a, c: torch.linalg.tensorsolve(
        (a.t() @ a + torch.eye(4, dtype=torch.float64)).reshape(2, 2, 2, 2), c.reshape(2, 2))),
    ("unique_consecutive_counts", [], lambda: torch.unique_consecutive(
        torch.tensor([4, 4, -1, 4, 7, 7, 7]), return_counts=True)[1].double()),
])


sp = torch.special
special_more = {
    "s": tensor([-30, -21, -20, -19.5, -8, -2.5, -1, -0.3, 0, 0.2, 0.5, 1.5, 7, 19.9, 20.5, 35,
                 100], 17),
    "e": tensor([-5, -2.5, -1, -0.3, 0, 0.2, 0.5, 0.75, 1.5, 7, 30, 1e5], 12),
    "p": tensor([1e-300, 1e-20, 1e-5, 0.003, 0.0099, 0.0101, 0.2, 0.5, 0.7, 0.99, 0.999999,
                 1 - 1e-12], 12),
    "pos": tensor([0.3, 1, 2.5, 7, 12], 5),
    "y": tensor([-0.5, 0, 2, -0.75, 3], 5),
}
sm_ = special_more
windows = []
for name, f in [("hann", torch.hann_window), ("hamming", torch.hamming_window),
                ("blackman", torch.blackman_window), ("bartlett", torch.bartlett_window),
                ("kaiser", torch.kaiser_window)]:
    for periodic in (True, False):
        for n in (1, 7, 8):
            windows.append(("%s_%s_%d" % (name, "periodic" if periodic else "symmetric", n), [],
                            lambda f=f, n=n, periodic=periodic: f(n, periodic, dtype=torch.float64)))
write("special_more_reference.txt", special_more, [
    ("i0", ["s"], sp.i0),
    ("i0e", ["s"], sp.i0e),
    ("i1", ["s"], sp.i1),
    ("i1e", ["s"], sp.i1e),
    ("i0_large", [], lambda: sp.i0(tensor([300, 700, -650], 3))),
    ("ndtr", ["s"], sp.ndtr),
    ("log_ndtr", ["s"], sp.log_ndtr),
    ("ndtri", ["p"], sp.ndtri),
    ("ndtri_edges", [], lambda: sp.ndtri(tensor([0, 1, -0.5, 1.5, nan], 5))),
    ("erfcx", ["e"], sp.erfcx),
    ("erfcx_overflow", [], lambda: sp.erfcx(tensor([-30, -27], 2))),
    ("entr", ["pos"], sp.entr),
    ("entr_edges", [], lambda: sp.entr(tensor([0, -1, nan], 3))),
    ("xlog1py", ["pos", "y"], lambda x, y: sp.xlog1py(x * tensor([1, 0, 1, 0, 1], 5), y)),
    ("xlog1py_zero", [], lambda: sp.xlog1py(tensor([0, 0, 0, 2], 4), tensor([-1, -3, nan, -1], 4))),
    ("multigammaln", ["pos"], lambda x: sp.multigammaln(x + 1, 3)),
    ("expit", ["s"], sp.expit),
    ("gammaln", ["pos"], sp.gammaln),
] + windows)
