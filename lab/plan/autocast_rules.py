"""CUDA's autocast rules on the CPU: `cuda_autocast_rules()` makes CPU autocast cast as CUDA autocast does.

`lab.plan.memory` traces a GPU training step on CPU fake tensors, under the CPU's autocast, whose op lists differ from
CUDA's; inside `cuda_autocast_rules()` every op CUDA runs in fp32 and the CPU leaves alone gets a kernel that does what
CUDA's does (removed on exit). A trace so run can count more than the GPU step, never less (docs/internals.md,
lab.plan.autocast_rules).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# From torch's aten/src/ATen/autocast_mode.h (AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, the fp32_append_dtype
# ops) against the AutocastCPU block of autocast_mode.cpp: the ops with a CUDA autocast kernel and none for the CPU
# that CUDA runs in fp32, as an fp32 copy of a bf16 input (CUDA_FP32), an fp32 result (CUDA_FP32_DTYPE) or the
# overload that takes a dtype (CUDA_FP32_NORM). In the lab's models relu2's square in the experts (`pow`) is one.
CUDA_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
             "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
             "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
             "cosine_similarity", "dist", "pdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d",
             "upsample_nearest3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
             "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
             "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa")
CUDA_FP32_DTYPE = ("softmax.int", "log_softmax.int", "cumsum", "cumprod", "sum", "sum.dim_IntList",
                   "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord")
CUDA_FP32_NORM = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
_LOW = (torch.bfloat16, torch.float16)


def _aten(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _below_autocast():
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def _fp32_kernel(op):
    """CUDA's `fp32` policy: bf16/fp16 tensor arguments cast to fp32, then the op below autocast."""
    def cast(a):
        if isinstance(a, torch.Tensor) and a.dtype in _LOW:
            return a.float()
        return [cast(x) for x in a] if isinstance(a, (list, tuple)) else a

    def kernel(*args, **kwargs):
        with _below_autocast():
            return op(*[cast(a) for a in args], **kwargs)
    return kernel


def _fp32_dtype_kernel(op):
    """CUDA's `fp32_set_opt_dtype` policy: a bf16/fp16 input with no dtype given runs with dtype=float32."""
    at = [a.name for a in op._schema.arguments].index("dtype")

    def kernel(*args, **kwargs):
        args = list(args)
        given = args[at] if at < len(args) else kwargs.get("dtype")
        if given is None and args[0].dtype in _LOW:
            if at < len(args):
                args[at] = torch.float32
            else:
                kwargs["dtype"] = torch.float32
        with _below_autocast():
            return op(*args, **kwargs)
    return kernel


def _fp32_norm_kernel(op, with_dtype):
    """CUDA's `fp32_append_dtype` policy: a bf16/fp16 input goes to the overload with dtype=float32 (its positional
    arguments in full: the dispatcher leaves out trailing ones at their defaults)."""
    defaults = [a.default_value for a in op._schema.arguments]

    def kernel(self, *args):
        with _below_autocast():
            if self.dtype not in _LOW:
                return op(self, *args)
            return with_dtype(self, *args, *defaults[1 + len(args):], dtype=torch.float32)
    return kernel


@contextmanager
def cuda_autocast_rules():
    """While open, CPU autocast casts as CUDA autocast does for CUDA_FP32, CUDA_FP32_DTYPE and CUDA_FP32_NORM
    (AutocastCPU kernels registered on torch's dispatcher, removed on exit); an op that has a CPU autocast kernel of
    its own is left alone."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        kernels = {**{n: _fp32_kernel(_aten(n)) for n in CUDA_FP32},
                   **{n: _fp32_dtype_kernel(_aten(n)) for n in CUDA_FP32_DTYPE},
                   **{n: _fp32_norm_kernel(_aten(n), _aten(to)) for n, to in CUDA_FP32_NORM.items()}}
        for name, kernel in kernels.items():
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCPU"):
                lib.impl(name, kernel, "AutocastCPU")
        yield
    finally:
        lib._destroy()
