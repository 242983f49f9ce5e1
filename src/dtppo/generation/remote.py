"""Generation on ranks of its own: the service each generation rank runs, and the trainer's client for it.

The generation ranks (``cluster.generation_ranks``) each hold a whole copy of the policy behind the ``Generator``
seam (dtppo's torch sampler or vLLM, as ``policy.generation`` selects) and do nothing but answer requests from
training rank 0, in the order it posts them, over ``distributed.bridge``:

- ``WEIGHTS v``: the policy of version v (after v steps), one flat fp32 buffer in one broadcast, loaded in place
  (vLLM: its in-place refit); or only the new number when the step did not update the policy.
- ``REQUEST tag v``: prompts to sample with policy version v exactly. The ranks split the rows, sample, and
  generation rank 0 gathers them and sends the batch back with how its time went (busy, waiting, loading).
- ``STOP``: the run is over.

Because the trainer posts every message in program order and each rank handles them one at a time, the version a
request asks for is the version the ranks hold when they reach it; a mismatch is a protocol error, raised. A
batch is therefore never generated across a weight change, and the tokens of a batch depend only on its prompts,
the sampling keys and that version's weights: a run is reproducible whatever the timing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dtppo.config import ClusterConfig, PolicyConfig
from dtppo.distributed.bridge import TRAINER, Bridge, BridgeError
from dtppo.distributed.parallelize import compute_dtype
from dtppo.distributed.ranks import run_worlds
from dtppo.errors import GenerationError
from dtppo.generation.generator import Generator, build_generator
from dtppo.models.causal_lm import build_policy, stop_token_ids
from dtppo.models.lora import add_adapters, merged_model
from dtppo.models.tokenizer import load_tokenizer
from dtppo.models.weights import weight_names
from dtppo.types import Experience, SampleRequest, SamplingParams, concat_rows

WEIGHTS, REQUEST, STOP = 1, 2, 3
_HEADER = 9  # int64 fields: kind, tag, version, n, tokens, max_new_tokens, greedy, key, min_new_tokens


@dataclass(frozen=True)
class RemoteBatch:
    """A batch as the generation ranks sent it: the rows, the policy version that sampled them, and their time
    (seconds): ``busy`` sampling it, ``waited`` idle for the trainer's messages, ``loading`` weights, over
    ``cycle`` (from the previous batch's reply to this one's)."""

    experience: Experience
    version: int
    busy: float
    waited: float
    loading: float
    cycle: float


# ---------------------------------------------------------------------------------------------- trainer side


class GenerationClient:
    """Training rank 0's end: posts weights and requests without waiting, collects batches in request order.

    Replies that arrive before they are asked for (a checkpoint collects every batch in flight) wait in
    ``received``; ``in_flight`` are the tags requested and not yet collected, oldest first.
    """

    def __init__(self, bridge: Bridge):
        self.bridge = bridge
        self.received: dict[int, RemoteBatch] = {}
        self.in_flight: deque[int] = deque()
        self.version = 0  # the last policy version published
        self._weight_posts: deque[dist.Work] = deque()
        self._samples = 0
        self.description = self._hello()

    def _hello(self) -> str:
        length = self._recv(torch.zeros(1, dtype=torch.long), "starting")
        return bytes(self._recv(torch.zeros(int(length), dtype=torch.uint8), "starting").tolist()).decode()

    def publish(self, flat: torch.Tensor | None, version: int) -> None:
        """Weights of policy version ``version`` (a flat fp32 buffer, ``flatten_weights``), or None when they did not
        change since the last version. Returns once posted; holds at most two weight buffers undelivered."""
        numel = 0 if flat is None else flat.numel()
        self._post(_header(WEIGHTS, 0, version, numel, 0, 0, int(flat is not None), 0, 0), "sending weights")
        if flat is not None:
            while len(self._weight_posts) > 1:
                with _link():
                    self.bridge.wait(self._weight_posts.popleft(), "sending weights")
            self._weight_posts.append(self._post(flat, "sending weights"))
        self.version = version

    def submit(self, tag: int, request: SampleRequest, version: int) -> None:
        """Ask for ``request`` sampled by policy version ``version``; ``tag`` names the batch (unique, in order). The
        generation ranks sample at ``policy.generation``'s temperature and top-p: the request's length, minimum
        length, greediness, stream key and sample ids travel."""
        prompts, params = request.prompts, request.params
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        header = _header(
            REQUEST,
            tag,
            version,
            len(prompts),
            len(tokens),
            params.max_new_tokens,
            params.greedy,
            request.key,
            params.min_new_tokens,
        )
        self._post(header, f"requesting batch {tag}")
        self._post(torch.cat([lengths, request.sample_ids.long(), tokens]), f"requesting batch {tag}")
        self.in_flight.append(tag)

    def sample(self, request: SampleRequest) -> Experience:
        """``Generator.sample``'s contract, answered by the generation ranks with the last version published, after
        every batch requested before (validation)."""
        self._samples += 1
        tag = -self._samples  # rollout batches are tagged by their step (>= 0)
        self.submit(tag, request, self.version)
        return self.collect(tag)[0].experience

    def collect(self, tag: int) -> tuple[RemoteBatch, float]:
        """The batch ``tag`` and the seconds spent waiting for it here (0 if it had arrived already)."""
        start = time.perf_counter()
        while tag not in self.received:
            if not self.in_flight:
                raise GenerationError(f"batch {tag} was never requested from the generation ranks")
            self._receive_next()
        waited = time.perf_counter() - start
        return self.received.pop(tag), waited

    def collect_all(self) -> None:
        """Receive every batch in flight (a checkpoint holds them)."""
        while self.in_flight:
            self._receive_next()

    def close(self) -> None:
        """STOP, then let the posts drain (best effort: the generation ranks may be gone)."""
        try:
            self._post(_header(STOP, 0, 0, 0, 0, 0, 0, 0, 0), "stopping")
        except GenerationError:
            return
        self.bridge.close()

    def _receive_next(self) -> None:
        tag = self.in_flight.popleft()
        self.received[tag] = self._receive(tag)

    def _receive(self, tag: int) -> RemoteBatch:
        what = f"generating batch {tag}"
        header = self._recv(torch.zeros(_HEADER, dtype=torch.long), what).tolist()
        got, version, rows, width = header[:4]
        if got != tag:
            raise GenerationError(f"the generation ranks answered batch {got} where batch {tag} was due")
        ids = self._recv(torch.zeros(rows, width, dtype=torch.long), what)
        attention = self._recv(torch.zeros(rows, width, dtype=torch.long), what)
        response = self._recv(torch.zeros(rows, width, dtype=torch.float32), what)
        logprobs = self._recv(torch.zeros(rows, width, dtype=torch.float32), what)
        truncated = self._recv(torch.zeros(rows, dtype=torch.long), what).bool()
        busy, waited, loading, cycle = (ns / 1e9 for ns in header[4:8])
        experience = Experience(ids, attention, response, logprobs, truncated)
        return RemoteBatch(experience, version, busy, waited, loading, cycle)

    def _post(self, tensor: torch.Tensor, what: str) -> dist.Work:
        with _link():
            return self.bridge.post(tensor, what)

    def _recv(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        with _link():
            return self.bridge.recv(tensor, what)


@contextmanager
def _link() -> Iterator[None]:
    """The bridge's failures as the run's: a GenerationError (one line, exit 6)."""
    try:
        yield
    except BridgeError as err:
        raise GenerationError(str(err)) from None


def _header(
    kind: int, tag: int, version: int, rows: int, tokens: int, max_new: int, greedy: int, key: int, min_new: int
) -> torch.Tensor:
    """A message's fixed int64 header (``_HEADER`` fields)."""
    return torch.tensor([kind, tag, version, rows, tokens, max_new, int(greedy), key, min_new], dtype=torch.long)


def flatten_weights(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """The named tensors of a full state dict as one flat fp32 buffer, in ``names`` order."""
    return torch.cat([state[name].detach().reshape(-1).float() for name in names])


def connect_client(cluster: ClusterConfig) -> GenerationClient:
    """Training rank 0's client, once every generation rank has built its model and its sampler."""
    worlds = run_worlds()
    assert worlds is not None and worlds.generation_rank is None, "training rank 0 of a run with generation ranks"
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    bridge = Bridge(worlds.store, TRAINER, 1 + cluster.generation_ranks, cluster.generation_timeout_s, device)
    return GenerationClient(bridge)


# ---------------------------------------------------------------------------------------------- generation side


class GenerationService:
    """One generation rank: its whole copy of the policy, its generator, and the loop over the trainer's posts.

    The copy computes in ``compute_dtype()`` (bf16 on GPU), like the colocated generation replica. ``init_path``:
    where the policy starts (``Config.policy_init_path``); ``seed``: ``ppo.seed``."""

    def __init__(
        self, policy: PolicyConfig, cluster: ClusterConfig, init_path: str | None, seed: int, max_prompt_tokens: int
    ):
        worlds = run_worlds()
        assert worlds is not None and worlds.generation_rank is not None, "a generation rank"
        self.policy, self.index, self.count = policy, worlds.generation_rank, cluster.generation_ranks
        torch.manual_seed(seed)
        self.tokenizer = load_tokenizer(init_path)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        model = build_policy(init_path, policy.model.tiny, seed, self.tokenizer)
        if policy.lora.adapter_path is not None:  # the trainer's starting weights: that adapter merged (a fresh
            model = merged_model(add_adapters(model, policy.lora, seed))  # one has B = 0: the base)
        model = model.to(device).eval().requires_grad_(False)
        for param in model.parameters():
            param.data = param.data.to(compute_dtype())
        self.model = model
        self.names = weight_names(model)
        self.numel = sum(p.numel() for _, p in model.named_parameters())
        self.generator: Generator = build_generator(
            policy.generation,
            model,
            stop_token_ids(model, self.tokenizer),
            self.tokenizer.pad_token_id,
            max_prompt_tokens=max_prompt_tokens,
            seed=seed,
            device=device,
            replica=None,
        )
        self.bridge = Bridge(worlds.store, 1 + self.index, 1 + self.count, cluster.generation_timeout_s, device)
        self.device = device
        self._clock = time.perf_counter()
        self._times = {"busy": 0.0, "waited": 0.0, "loading": 0.0}

    def run(self) -> None:
        """Serve until STOP."""
        if self.index == 0:
            text = torch.tensor(list(f"{self.count} generation rank(s), {self.generator.describe()}".encode()))
            self._send(torch.tensor([len(text)]))
            self._send(text.to(torch.uint8))
        try:
            while True:
                start = time.perf_counter()
                header = self.bridge.take(torch.zeros(_HEADER, dtype=torch.long), "waiting for the trainer").tolist()
                self._times["waited"] += time.perf_counter() - start
                if header[0] == STOP:
                    self.bridge.close()
                    return
                if header[0] == WEIGHTS:
                    self._load_weights(header[2], header[3], bool(header[6]))
                else:
                    self._answer(header)
        finally:
            self.generator.close()

    def _load_weights(self, version: int, numel: int, changed: bool) -> None:
        start = time.perf_counter()
        if changed:
            if numel != self.numel:
                raise GenerationError(
                    f"the trainer sent {numel} weights, the generation ranks' policy has {self.numel}: "
                    f"they were built from different models"
                )
            flat = self.bridge.take(torch.empty(numel, dtype=torch.float32, device=self.device), "receiving weights")
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                offset = 0
                for name in self.names:
                    param = params[name]
                    param.copy_(flat[offset : offset + param.numel()].view_as(param))
                    offset += param.numel()
        self.generator.refit(self.model, version)
        self._times["loading"] += time.perf_counter() - start

    def _answer(self, header: list[int]) -> None:
        _, tag, version, rows, tokens, max_new_tokens, greedy, key, min_new_tokens = header
        payload = self.bridge.take(torch.zeros(2 * rows + tokens, dtype=torch.long), f"receiving batch {tag}")
        if version != self.generator.version:
            raise GenerationError(
                f"batch {tag} asks for policy version {version}, the generation ranks hold {self.generator.version}"
            )
        start = time.perf_counter()
        lengths, sample_ids, flat = payload[:rows], payload[rows : 2 * rows], payload[2 * rows :]
        prompts = [p.tolist() for p in torch.split(flat, lengths.tolist())]
        gen = self.policy.generation
        params = SamplingParams(max_new_tokens, gen.temperature, gen.top_p, bool(greedy), min_new_tokens)
        mine = torch.tensor_split(torch.arange(rows), self.count)[self.index]
        part = None
        if len(mine):
            self.generator.prepare()
            part = self.generator.sample(SampleRequest(prompts, params, key, sample_ids).take(mine.tolist()))
            self.generator.finish()
        experience = self._gather(part)
        self._times["busy"] += time.perf_counter() - start
        if self.index == 0:
            self._reply(tag, version, experience)

    def _gather(self, part: Experience | None) -> Experience | None:
        """Every rank's rows on generation rank 0 (None elsewhere), in rank order."""
        if self.count == 1:
            return part
        parts = [None] * self.count if self.index == 0 else None
        dist.gather_object(part, parts, dst=0)
        if self.index != 0:
            return None
        return concat_rows([p for p in parts if p is not None], self.tokenizer.pad_token_id)

    def _reply(self, tag: int, version: int, experience: Experience) -> None:
        now = time.perf_counter()
        times = self._times
        cycle = now - self._clock
        header = [tag, version, *experience.input_ids.shape, times["busy"], times["waited"], times["loading"], cycle]
        header[4:] = [int(seconds * 1e9) for seconds in header[4:]]
        self._send(torch.tensor([*header, 0], dtype=torch.long))  # zero-filled to the _HEADER fields
        for tensor in (experience.input_ids, experience.attention_mask):
            self._send(tensor.long())
        for tensor in (experience.response_mask, experience.gen_logprobs):
            self._send(tensor.float())
        self._send(experience.truncated.long())
        self._clock, self._times = now, {"busy": 0.0, "waited": 0.0, "loading": 0.0}

    def _send(self, tensor: torch.Tensor) -> None:
        self.bridge.send(tensor.contiguous().cpu(), "sending a batch")


def serve(
    policy: PolicyConfig, cluster: ClusterConfig, init_path: str | None, seed: int, max_prompt_tokens: int
) -> None:
    """A generation rank's whole life: build (``GenerationService``'s arguments), serve until STOP (a lost trainer
    is an error naming it)."""
    service = GenerationService(policy, cluster, init_path, seed, max_prompt_tokens)
    try:
        service.run()
    except BridgeError as err:
        raise GenerationError(str(err)) from None
