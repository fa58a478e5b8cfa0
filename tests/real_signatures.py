"""The real signatures of the GPU-only functions the lab calls, on the CPU, and stand-ins built from them.

`make gpu-sources` (scripts/gpu_sources.sh) fetches the pinned packages once, with `pip download --no-deps` (vLLM's
wheel, causal-conv1d's and mamba-ssm's sdists), and keeps their few .py files in .gpu-sources/; tests never fetch.
A signature is read from the function's own `def` in that source (`ast`: every parameter's name, kind and whether
it has a default; decorators checked to be ones that keep the signature), not by importing the module: importing
them needs Triton, their CUDA extensions and, for vLLM, hundreds of modules this CPU venv does not have. For a
dataclass or msgspec Struct (EngineArgs, SamplingParams, LoRARequest) it is the constructor's keywords: the class's
annotated fields. torch's `varlen_attn` is the installed torch's own function.

`stand_in(name, body)` binds every call with `inspect.signature(...).bind(...)` before running `body`, so a call
the real function would refuse fails in the test too; `hub_kernel(name, body)` is what transformers' Nemotron-H calls
when the package imports (its `use_kernel_func_from_hub_with_fallback` wrapper over such a stand-in, which keeps only
the keywords the real function names).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
import types
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / ".gpu-sources"

# name -> (package, file under .gpu-sources/<package>/, qualified name in it); "Class" alone: its fields
WHERE = {
    "causal_conv1d_fn": ("causal-conv1d", "causal_conv1d/causal_conv1d_interface.py", "causal_conv1d_fn"),
    "causal_conv1d_update": ("causal-conv1d", "causal_conv1d/causal_conv1d_interface.py", "causal_conv1d_update"),
    "mamba_chunk_scan_combined": ("mamba-ssm", "mamba_ssm/ops/triton/ssd_combined.py", "mamba_chunk_scan_combined"),
    "mamba_split_conv1d_scan_combined": ("mamba-ssm", "mamba_ssm/ops/triton/ssd_combined.py",
                                         "mamba_split_conv1d_scan_combined"),
    "LLM": ("vllm", "vllm/entrypoints/llm.py", "LLM.__init__"),
    "LLM.generate": ("vllm", "vllm/entrypoints/llm.py", "LLM.generate"),
    "LLM.sleep": ("vllm", "vllm/entrypoints/llm.py", "LLM.sleep"),
    "LLM.wake_up": ("vllm", "vllm/entrypoints/llm.py", "LLM.wake_up"),
    "LLM.collective_rpc": ("vllm", "vllm/entrypoints/llm.py", "LLM.collective_rpc"),
    "EngineArgs": ("vllm", "vllm/engine/arg_utils.py", "EngineArgs"),
    "SamplingParams": ("vllm", "vllm/sampling_params.py", "SamplingParams"),
    "LoRARequest": ("vllm", "vllm/lora/request.py", "LoRARequest"),
    "LLMEngine.add_request": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.add_request"),
    "LLMEngine.step": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.step"),
    "LLMEngine.abort_request": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.abort_request"),
    "LLMEngine.has_unfinished_requests": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.has_unfinished_requests"),
    "LLMEngine.add_lora": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.add_lora"),
    "LLMEngine.remove_lora": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.remove_lora"),
    "Worker.reload_weights": ("vllm", "vllm/v1/worker/gpu_worker.py", "Worker.reload_weights"),
    "GPUModelRunner.reload_weights": ("vllm", "vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner.reload_weights"),
}
# decorators that leave a function's signature as written
KEEPS_SIGNATURE = {"staticmethod", "classmethod", "property", "torch.inference_mode", "torch.no_grad",
                   "dataclass", "config"}


def pins() -> list[str]:
    """The pinned versions, read where scripts/gpu_sources.sh reads them."""
    import re

    py = (ROOT / "pyproject.toml").read_text()
    sh = (ROOT / "scripts" / "build_mamba_wheels.sh").read_text()
    return [re.search(r'"(vllm==[^"]+)"', py).group(1), re.search(r'"(causal-conv1d==[^"]+)"', sh).group(1),
            re.search(r'"(mamba-ssm==[^"]+)"', sh).group(1)]


def version(package: str) -> str:
    """`package==version` as pinned (torch: the installed one)."""
    if package == "torch":
        import torch

        return f"torch=={torch.__version__}"
    return next(p for p in pins() if p.startswith(package + "=="))


def require_sources() -> None:
    """Skip without .gpu-sources (`make gpu-sources`); fail under CI (`make test-all` fetches them) or when they are
    another version than the pins."""
    stamp = SOURCES / "VERSIONS"
    if not stamp.is_file():
        msg = "the pinned GPU packages' sources are not here: run `make gpu-sources`"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    have = stamp.read_text().split()
    if have != pins():
        pytest.fail(f".gpu-sources holds {have}, the pins are {pins()}: run `make gpu-sources`")


class Default:
    """A parameter's default as its source text (the signature keeps only that there is one)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def _node(tree: ast.Module, qualname: str):
    scope = tree.body
    for part in qualname.split("."):
        found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == part and not any(ast.unparse(d) == "overload" for d in n.decorator_list)]
        if len(found) != 1:
            raise LookupError(f"{qualname}: {len(found)} definitions of {part}")
        node = found[0]
        scope = node.body
    return node


def _function_signature(node, method: bool) -> inspect.Signature:
    odd = [ast.unparse(d) for d in node.decorator_list if ast.unparse(d).split("(")[0] not in KEEPS_SIGNATURE]
    if odd:
        raise LookupError(f"{node.name}: decorators {odd} may change its signature")
    a, P = node.args, inspect.Parameter
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
    params = [P(x.arg, P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
                default=P.empty if d is None else Default(ast.unparse(d)))
              for i, (x, d) in enumerate(zip(positional, defaults))]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    params += [P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else Default(ast.unparse(d)))
               for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    if method and not any(ast.unparse(d) == "staticmethod" for d in node.decorator_list):
        params = params[1:]  # self / cls: the signature of the bound method
    return inspect.Signature(params)


def _fields_signature(node: ast.ClassDef) -> inspect.Signature:
    """A dataclass's or msgspec Struct's constructor: its annotated fields in order (ClassVar excluded)."""
    P, params = inspect.Parameter, []
    for n in node.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and "ClassVar" not in ast.unparse(
                n.annotation):
            default = P.empty if n.value is None else Default(ast.unparse(n.value))
            params.append((n.target.id, default))
    seen_default, out = False, []
    for name, default in params:  # a required field after a defaulted one is keyword-only (kw_only layouts)
        seen_default |= default is not P.empty
        kind = P.KEYWORD_ONLY if seen_default and default is P.empty else P.POSITIONAL_OR_KEYWORD
        out.append(P(name, kind, default=default))
    return inspect.Signature(sorted(out, key=lambda p: p.kind))


@functools.cache
def signature(name: str) -> inspect.Signature:
    """The real signature of `name` (a key of WHERE, or "varlen_attn": torch's)."""
    if name == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn

        return inspect.signature(varlen_attn)
    require_sources()
    package, path, qualname = WHERE[name]
    tree = ast.parse((SOURCES / package / path).read_text(encoding="utf-8"))
    node = _node(tree, qualname)
    if isinstance(node, ast.ClassDef):
        return _fields_signature(node)
    return _function_signature(node, method="." in qualname)


def package_of(name: str) -> str:
    return "torch" if name == "varlen_attn" else WHERE[name][0]


def check(name: str, *args, **kwargs) -> inspect.BoundArguments:
    """`inspect.signature(real).bind(*args, **kwargs)`: a TypeError where the real function would raise one."""
    try:
        return signature(name).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{name} ({version(package_of(name))}): {e}") from e


class Call(NamedTuple):
    """One call a stand-in took: what was passed, how it bound, and the stand-in (to replay it)."""

    name: str
    bound: inspect.BoundArguments
    args: tuple
    kwargs: dict
    fn: object


def stand_in(name: str, body=None, calls: list | None = None, method: bool = False):
    """A function with `name`'s real signature that binds every call (`check`), appends a `Call` to `calls` and
    returns `body(*args, **kwargs)` (None without a body). `method`: the first argument is the instance (not bound;
    the real signature is the bound method's)."""
    def fn(*args, **kwargs):
        bound = check(name, *(args[1:] if method else args), **kwargs)
        if calls is not None:
            calls.append(Call(name, bound, args, kwargs, fn))
        return None if body is None else body(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = name.rsplit(".", 1)[-1]
    if not method:
        fn.__signature__ = signature(name)
    return fn


HUB_PACKAGES = {"causal_conv1d_fn": "causal_conv1d", "causal_conv1d_update": "causal_conv1d",
                "mamba_chunk_scan_combined": "mamba_ssm", "mamba_split_conv1d_scan_combined": "mamba_ssm"}


def hub_kernel(monkeypatch, name: str, torch_function, body=None, calls: list | None = None, sig=None):
    """What transformers' Nemotron-H calls for `name` where its package imports: transformers' own
    `use_kernel_func_from_hub_with_fallback` applied to `torch_function` (the module's fallback) with the package
    providing `stand_in(name, body, calls)`. `sig` (negative controls): another signature for the stand-in."""
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    package = HUB_PACKAGES[name]
    kernel = stand_in(name, body, calls)
    if sig is not None:
        kernel.__signature__ = sig
    fake = types.ModuleType(package)
    setattr(fake, name, kernel)
    monkeypatch.setitem(sys.modules, package, fake)
    try:
        wrapped = use_kernel_func_from_hub_with_fallback(name, package)(getattr(torch_function, "__wrapped__",
                                                                                 torch_function))
    finally:
        monkeypatch.delitem(sys.modules, package)
    return wrapped


def replay_misspelled(call: Call, keyword: str | None = None):
    """The negative control: `call` again through its stand-in with `keyword` (default: its last keyword) misspelled,
    or a made-up keyword added when it passed none. Returns the stand-in's answer (a TypeError is expected)."""
    kwargs = dict(call.kwargs)
    if kwargs:
        k = keyword or list(kwargs)[-1]
        kwargs[k + "_misspelled"] = kwargs.pop(k)
    else:
        kwargs["no_such_keyword"] = 1
    return call.fn(*call.args, **kwargs)
