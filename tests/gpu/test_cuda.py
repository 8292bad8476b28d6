"""wharf's accelerator paths on a real CUDA device: `./run gpu-test`.

`./run test` leaves this folder out (CI machines have no GPU, and a skipped test fails its
summary); `./run gpu-test` runs it and fails, never skips, when torch sees no CUDA device.
What runs here: safetensors models loaded onto the GPU (all dtypes, sharded, through a tier),
wharf.torch.save/load of CUDA tensors, DCP save/load/async_save of CUDA state through wharf's
StorageWriter/StorageReader, CheckpointManager saving a CUDA model and optimizer while the loop
keeps training and restoring it in place (CUDA RNG included: a resumed run equals the
uninterrupted one bit for bit), Lightning on the GPU with wharf's CheckpointIO, and a dataset
feeding the GPU through pinned memory. Every store here is file:// or a tier: the GPU machine
runs no object store.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import wharf
import wharf.torch

# cuBLAS is deterministic only with a fixed workspace (set before its first use).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# WHARF_GPU_TEST_DEVICE=cpu runs the same tests on the CPU: to work on them without a GPU.
# It is never what `./run gpu-test` runs.
ON_CPU = os.environ.get("WHARF_GPU_TEST_DEVICE") == "cpu"
if not ON_CPU and not torch.cuda.is_available():  # fail the run, never skip it
    raise RuntimeError("tests/gpu needs a CUDA device, and torch sees none "
                       f"(torch {torch.__version__}, CUDA {torch.version.cuda})")

CUDA = torch.device("cpu") if ON_CPU else torch.device("cuda", torch.cuda.current_device())


def _bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in CPU memory (any dtype, 0-d and empty ones too)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same(got: dict, want: dict, device=CUDA) -> None:
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert g.device == device, (name, g.device)
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape)
        assert _bytes(g) == _bytes(w), name


def _tensors(seed=0, big=8 << 20) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = {
        "f32": torch.randn(257, 129, generator=g),
        "f64": torch.randn(33, generator=g, dtype=torch.float64),
        "f16": torch.randn(1000, generator=g).half(),
        "bf16": torch.randn(4, 250, generator=g).bfloat16(),
        "i64": torch.arange(-50, 50),
        "i32": torch.randint(-1000, 1000, (99,), generator=g, dtype=torch.int32),
        "i16": torch.randint(-1000, 1000, (7, 7), generator=g, dtype=torch.int16),
        "i8": torch.randint(-100, 100, (65,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (333,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(77, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
        "big": torch.randn(big, generator=g),  # 32 MiB: many ranged reads
    }
    if hasattr(torch, "float8_e4m3fn"):
        t["f8"] = torch.randn(64, generator=g).to(torch.float8_e4m3fn)
    return t


def _save_model(folder: pathlib.Path, shards: int = 1) -> tuple:
    """A safetensors model written by the safetensors library; returns (uri, what
    safetensors.torch.load_file gives on the GPU, in load_file's order)."""
    from safetensors.torch import load_file, save_file
    folder.mkdir(parents=True, exist_ok=True)
    tensors = _tensors()
    if shards == 1:
        path = folder / "model.safetensors"
        save_file(tensors, str(path))
        return str(path), load_file(str(path), device=str(CUDA))
    names = list(tensors)
    weight_map, want = {}, {}
    for s in range(shards):
        part = {n: tensors[n] for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / fname))
        weight_map.update({n: fname for n in part})
        want.update(load_file(str(folder / fname), device=str(CUDA)))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return str(index), want


# ---- model loading onto the GPU (wharf.serve) ----

@pytest.mark.parametrize("device", ["cpu"] if ON_CPU else
                         ["cuda", "cuda:0", 0, torch.device("cuda")])
def test_load_safetensors_onto_the_gpu_equals_load_file(tmp_path, device):
    from wharf.serve import load_safetensors
    path, want = _save_model(tmp_path)
    got = load_safetensors(path, device=device)
    _same(got, want)
    got = load_safetensors("file://" + path, device=device)
    _same(got, want)


def test_iter_safetensors_hands_over_gpu_tensors_as_they_complete(tmp_path):
    from wharf.serve import iter_safetensors
    path, want = _save_model(tmp_path)
    got = {}
    for name, t in iter_safetensors(path, device=CUDA):
        assert t.device == CUDA
        # The caller may use the tensor at once (its copy is ordered on the current stream).
        got[name] = t.clone()
    assert sorted(got) == sorted(want)
    _same({n: got[n] for n in want}, want)


def test_sharded_index_onto_the_gpu(tmp_path):
    from wharf.serve import load_safetensors
    index, want = _save_model(tmp_path, shards=3)
    got = load_safetensors(index, device=CUDA)
    assert sorted(got) == sorted(want)
    _same({n: got[n] for n in want}, want)


def test_load_through_a_tier_onto_the_gpu(tmp_path):
    from wharf.serve import load_safetensors
    path, want = _save_model(tmp_path / "bucket")
    tier = tmp_path / "tier"
    for _ in range(2):  # a miss that fills the tier, then a hit
        _same(load_safetensors("file://" + path, device=CUDA, cache=str(tier)), want)
    objects = [p for p in (tier / ".wharf" / "objects").rglob("*") if p.is_file()]
    assert objects, "the read-through load left nothing in the tier"


def test_a_load_onto_the_gpu_holds_bounded_host_memory(tmp_path):
    """A 2 GiB model goes to the GPU through the staging buffers (4 x 64 MiB), never a host
    copy of the model: the loading process's peak RSS grows by well under half the model's
    size (a host copy of it grew it by 2,019 MiB on an H200; the staged load by 604, the
    same as safetensors.torch.load_file(device="cuda") there). The peak is read right after
    the load: the first kernels a process runs map the CUDA libraries' code, which is RSS too.
    """
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    save_file({f"w{i}": torch.randn(8 << 20, generator=g) for i in range(64)},
              str(tmp_path / "big.safetensors"))
    script = f"""
import resource, torch, wharf.serve
torch.empty(1, device={str(CUDA)!r})
with open("/proc/self/statm") as f:
    before = int(f.read().split()[1]) * 4096 / 2**20
got = wharf.serve.load_safetensors({str(tmp_path / "big.safetensors")!r}, device={str(CUDA)!r})
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
assert len(got) == 64 and all(t.device.type == {CUDA.type!r} for t in got.values())
assert float(got["w3"].abs().sum()) > 0
print(grew)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    grew = float(proc.stdout.strip().splitlines()[-1])
    assert ON_CPU or grew < 1024, f"peak RSS grew by {grew:.0f} MiB for a 2 GiB model"


# ---- torch.save / torch.load of CUDA tensors ----

def test_torch_save_and_load_of_cuda_tensors(tmp_path):
    state = {"w": torch.randn(1000, 33, device=CUDA), "i": torch.arange(10, device=CUDA),
             "h": torch.randn(5, device=CUDA).half(), "step": 7}
    uri = "file://" + str(tmp_path / "state.pt")
    wharf.torch.save(state, uri)
    # torch.load of wharf's object and wharf's load of it agree with the original.
    plain = torch.load(str(tmp_path / "state.pt"), weights_only=True)
    for got in (plain, wharf.torch.load(uri, weights_only=True)):
        assert got["step"] == 7
        for k in ("w", "i", "h"):
            assert got[k].device == CUDA and torch.equal(got[k], state[k])
    cpu = wharf.torch.load(uri, map_location="cpu")
    assert all(cpu[k].device.type == "cpu" and torch.equal(cpu[k], state[k].cpu())
               for k in ("w", "i", "h"))


# ---- DCP through wharf's StorageWriter / StorageReader ----

@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo" if ON_CPU else "cpu:gloo,cuda:nccl", init_method=f"file://{tmp_path}/pg",
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                               torch.nn.Linear(128, 10)).to(CUDA)


def test_dcp_save_load_and_async_save_of_cuda_state(tmp_path, process_group):
    import torch.distributed.checkpoint as dcp
    from wharf.torch.checkpoint import StorageReader, StorageWriter
    model = _net(0)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    uri = "file://" + str(tmp_path / "dcp")
    dcp.save({"model": model.state_dict()}, storage_writer=StorageWriter(uri))
    other = _net(1)
    sd = other.state_dict()
    dcp.load({"model": sd}, storage_reader=StorageReader(uri))
    other.load_state_dict(sd)
    for k, v in other.state_dict().items():
        assert v.device == CUDA and torch.equal(v, want[k]), k

    # async_save: staged to CPU, then written while the GPU state changes.
    uri2 = "file://" + str(tmp_path / "dcp-async")
    future = dcp.async_save({"model": model.state_dict()}, storage_writer=StorageWriter(uri2))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    future.result()
    sd = _net(2).state_dict()
    dcp.load({"model": sd}, storage_reader=StorageReader(uri2))
    for k, v in sd.items():
        assert torch.equal(v, want[k]), k


def test_dcp_save_of_cuda_state_larger_than_a_wave(tmp_path, process_group):
    """640 MiB of CUDA tensors: written through two pinned 256 MiB buffers in waves of files
    (more files than files_per_rank), loaded back in place equal."""
    import torch.distributed.checkpoint as dcp
    from wharf.torch.checkpoint import StorageReader, StorageWriter
    g = torch.Generator(device=CUDA).manual_seed(0)
    state = {f"w{i}": torch.randn(16 << 20, device=CUDA, generator=g) for i in range(10)}
    uri = "file://" + str(tmp_path / "waves")
    writer = StorageWriter(uri, files_per_rank=2)
    if ON_CPU:
        writer._stage_all = True
    dcp.save({"m": state}, storage_writer=writer)
    files = [f for f in os.listdir(tmp_path / "waves") if f.endswith(".distcp")]
    assert len(files) > 2, files
    got = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load({"m": got}, storage_reader=StorageReader(uri))
    for k, v in state.items():
        assert got[k].device == CUDA and torch.equal(got[k], v), k


# ---- CheckpointManager with a CUDA model ----

def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(32, 64, device=CUDA)  # the CUDA RNG draws the data and the dropout
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _seed(seed: int) -> None:
    (torch.manual_seed if ON_CPU else torch.cuda.manual_seed)(seed)


@pytest.mark.parametrize("async_save", [True, False])
def test_manager_resume_on_the_gpu_equals_the_uninterrupted_run(tmp_path, async_save):
    from wharf.torch import CheckpointManager
    torch.use_deterministic_algorithms(True)
    try:
        # The uninterrupted run: 6 steps.
        model = _net(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _seed(123)
        _train(model, opt, 6)
        want = {k: v.clone() for k, v in model.state_dict().items()}

        # The same run checkpointed after 3 steps; the loop goes on while the save is written.
        model = _net(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _seed(123)
        _train(model, opt, 3)
        at3 = {k: v.clone() for k, v in model.state_dict().items()}
        mgr = CheckpointManager(str(tmp_path / "ckpt"), async_save=async_save)
        handle = mgr.save(3, {"model": model, "opt": opt}, metrics={"loss": 1.0})
        _train(model, opt, 2)  # mutates the GPU state while an async save writes
        handle.result()
        mgr.wait()

        # Without a state: the saved tensors, on CPU, as they were at step 3.
        saved = mgr.restore(3)
        for k, v in at3.items():
            assert torch.equal(saved["model"][k], v.cpu()), k

        # In place into a fresh model and optimizer on the GPU, RNG included, then the
        # remaining 3 steps: bit for bit the uninterrupted run.
        model2 = _net(7)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        _seed(999)  # restore must put the CUDA RNG back
        CheckpointManager(str(tmp_path / "ckpt")).restore(3, state={"model": model2,
                                                                     "opt": opt2})
        for k, v in model2.state_dict().items():
            assert v.device == CUDA and torch.equal(v, at3[k]), k
        exp_avg = opt2.state_dict()["state"][0]["exp_avg"]
        assert not torch.equal(exp_avg, torch.zeros_like(exp_avg))
        assert exp_avg.device == CUDA
        _train(model2, opt2, 3)
        for k, v in model2.state_dict().items():
            assert torch.equal(v, want[k]), k
    finally:
        torch.use_deterministic_algorithms(False)


def test_manager_saves_gpu_state_of_many_tensors_while_it_changes(tmp_path):
    """A state of 64 CUDA tensors (256 MiB), saved async three times while each is
    overwritten right after save() returns: every checkpoint holds its own values."""
    from wharf.torch import CheckpointManager
    state = {f"t{i}": torch.full((1 << 20,), float(i), device=CUDA) for i in range(64)}
    mgr = CheckpointManager(str(tmp_path / "many"), keep_last=3)
    for step in range(3):
        mgr.save(step, {"state": state})
        for t in state.values():
            t.add_(100.0)
    mgr.wait()
    for step in range(3):
        got = mgr.restore(step)["state"]
        for i in range(64):
            assert torch.equal(got[f"t{i}"], torch.full((1 << 20,), i + 100.0 * step)), (step, i)


# ---- Lightning on the GPU ----

@pytest.mark.parametrize("flavour", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_gpu_trainer_saves_and_resumes_through_wharf(tmp_path, flavour):
    # In a subprocess: each flavour's Trainer sets up CUDA and process state of its own.
    script = f"""
import sys, torch, importlib
pl = importlib.import_module({flavour!r})
import wharf.lightning
from torch.utils.data import DataLoader, TensorDataset

class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)
        self.seen = set()
    def training_step(self, batch, _):
        x, y = batch
        self.seen.add((x.device.type, self.net.weight.device.type))
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)),
                  batch_size=8)
kw = dict(accelerator={"cpu" if ON_CPU else "gpu"!r}, devices=1, logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False,
          default_root_dir={str(tmp_path)!r}, plugins=[wharf.lightning.CheckpointIO()])
uri = "file://{tmp_path}/run/last.ckpt"
m = M()
t = pl.Trainer(max_steps=3, **kw)
t.fit(m, data)
assert m.seen == {{({CUDA.type!r}, {CUDA.type!r})}}, m.seen
t.save_checkpoint(uri)
ck = torch.load("{tmp_path}/run/last.ckpt", map_location="cpu", weights_only=False)
assert ck["global_step"] == 3, ck["global_step"]
assert torch.equal(ck["state_dict"]["net.weight"], m.net.weight.detach().cpu())
m2 = M()
t2 = pl.Trainer(max_steps=5, **kw)
t2.fit(m2, data, ckpt_path=uri)
assert t2.global_step == 5, t2.global_step
print("ok", t2.global_step)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0 and "ok 5" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ---- a dataset feeding the GPU ----

def test_dataset_batches_reach_the_gpu_through_pinned_memory(tmp_path):
    import numpy as np
    from torch.utils.data import DataLoader
    from wharf.torch import MapDataset
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(64):
        (folder / f"s{i:03d}.bin").write_bytes(np.full(256, i, dtype=np.uint8).tobytes())

    def decode(sample):
        return torch.tensor(np.frombuffer(sample.data, dtype=np.uint8).copy())

    ds = MapDataset.from_prefix("file://" + str(folder) + "/", transform=decode)
    loader = DataLoader(ds, batch_size=16, num_workers=2, pin_memory=not ON_CPU)
    seen = []
    for batch in loader:
        assert ON_CPU or batch.is_pinned()
        gpu = batch.to(CUDA, non_blocking=True)
        seen.extend(gpu[:, 0].tolist())
        assert torch.equal(gpu.cpu()[:, 0:1].expand(-1, 256), gpu.cpu())
    assert sorted(seen) == list(range(64))
