"""wharf.serve: model loading for inference and a prediction cache (docs/design/serve.md).

    from wharf.serve import load_safetensors, iter_safetensors, PredictionCache
    state = load_safetensors("s3://models/llm/model.safetensors.index.json", device="cpu")
    for name, tensor in iter_safetensors(["s3://m/a.safetensors", "s3://m/b.safetensors"]):
        gpu[name] = tensor.to("cuda", non_blocking=True)      # overlaps the remaining reads
    cache = PredictionCache("redis://127.0.0.1:6379/0", ttl=3600, max_bytes="1G")
    out = cache.get_or_compute("model-v3", {"text": "hello"}, lambda req: run_model(req))

The loaders need torch; the cache does not (its Redis backend needs the `redis` package).
"""
from typing import TYPE_CHECKING

__all__ = ["load_safetensors", "iter_safetensors", "PredictionCache"]


def __getattr__(name):
    # Lazy: `import wharf.serve` must not import torch (the cache works without it).
    if name in ("load_safetensors", "iter_safetensors"):
        from wharf.serve import _safetensors
        return getattr(_safetensors, name)
    if name == "PredictionCache":
        from wharf.serve.cache import PredictionCache
        return PredictionCache
    raise AttributeError(f"module 'wharf.serve' has no attribute {name!r}")


def __dir__():
    # The lazy names too, so that dir() and help() list the public API (listing them imports
    # nothing; help() then imports the loaders, and torch with them).
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
    from wharf.serve._safetensors import iter_safetensors, load_safetensors  # noqa: F401
    from wharf.serve.cache import PredictionCache  # noqa: F401
