"""The sampling engine: one batched decode over every request in flight.

A background thread owns the model. Requests (prompt, ``num_samples``, params)
arrive on a queue at any time; each is prefilled once (reusing the longest
cached prefix), its ``num_samples`` rows share that prefill, and the rows join
the running batch at the next step. Every step feeds the last token of every
row through the model in one forward call (right-aligned KV cache, left
padding masked), samples each row with its own generator, and retires rows
that hit a stop token, a stop string or ``max_tokens``. A request's future
resolves when its last row finishes; finished rows leave their KV in the
prefix cache for the continuation that usually follows.

Batch bookkeeping never copies the rows that stay (``kv.BatchCache``): a
joining row is written into a finished row's slot (or a new one), a finished
row frees its slot and is computed and ignored until a new row takes it; the
batch is compacted (one copy) only when free slots outnumber live ones.

Logprobs are the policy's own: ``log_softmax`` of the raw logits at
temperature 1, with no top-p/top-k filtering, in float32. Temperature, top-k
and top-p shape only which token is drawn. So ``forward`` on the same tokens
returns the same numbers (up to float rounding), which PPO's ratio needs.

Sampling is batched across rows (one ``log_softmax`` over the whole batch,
top-k/top-p only for the rows that ask) and draws by inverse CDF: each row
takes ONE uniform from its own generator per token and the token is found by a
search over its cumulative probabilities. So a row's tokens depend only on its
seed, its index among the request's samples and its logits, never on which
other rows share the batch. (The logits themselves can differ in the last bits
with the batch's shape, in HF's forward as in the lean step: matrix kernels
block differently for different row counts and paddings. A draw that lands
within ~1e-7 of a CDF boundary can then flip, so sampled tokens are
reproducible for the same requests in the same batch, not bitwise across
batch compositions; the logprobs always match ``forward`` within 1e-4.)

For Llama models the decode step runs :class:`~retool.backends.local.decode.LeanDecoder`
(1.2-1.9x faster than HF's forward for this shape on CPU; see ``decode.py``);
other models use HF's forward. Prefill runs HF's decoder (``model.model``);
for Llama models the head on the last position is the lean decoder's (HF's
``logits_to_keep`` path copies a bf16 head whole each call), and a bf16 model
keeps its batch cache in float32 (``LeanDecoder.cache_dtype``). The engine
thread is the only one holding an OpenMP pool while it decodes: the backend's
other calls run in short-lived workers (``threads.py``).

Stopping: ``close()`` sets a flag and wakes the thread, which fails every
request in flight or queued ("the sampling engine was closed") and exits at
the next step boundary; ``close()`` joins it. Every live engine is closed at
interpreter exit (``atexit``), so the interpreter never finalises while the
thread is inside torch (which aborted Ctrl-C'd runs with "terminate called
without an active exception", exit 134).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import DynamicCache

from retool.backends.local.decode import lean_decoder_for
from retool.backends.local.kv import (
    KV,
    BatchCache,
    PrefixCache,
    PrefixStats,
    cache_kv,
    cache_kwarg,
    make_cache,
    make_cache_empty,
)
from retool.backends.local.threads import mark_compute_thread
from retool.types import SampledSequence, SampleResponse, SamplerStop, SamplingParams, Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_SEED_STRIDE = 1_000_003
_SPARE = 256  # batch cache columns allocated ahead of need (a copy every _SPARE steps at most)
_LEFT = 128  # batch cache columns kept free on the left, for rows longer than every row in it
_MIN_PREFIX = 32  # a shared prefix shorter than this is not worth its extra products
_COMPACT_ROWS = 8  # compact the batch (a copy) when free slots outnumber live ones, above this
_TOP_P_CANDIDATES = 1024  # top-p looks at this many most likely tokens first
_CLOSE_TIMEOUT_S = 60.0  # longest a close() waits for the step in progress

_LIVE_ENGINES: weakref.WeakSet[SamplingEngine] = weakref.WeakSet()


def _close_live_engines() -> None:
    """At interpreter exit: stop every engine thread before torch is torn down."""
    for engine in list(_LIVE_ENGINES):
        engine.close()


atexit.register(_close_live_engines)


@dataclass
class _Request:
    prompt: list[int]
    num_samples: int
    params: SamplingParams
    future: ConcurrentFuture[SampleResponse]
    done: list[SampledSequence | None] = field(default_factory=list)
    remaining: int = 0


@dataclass
class _Row:
    request: _Request
    index: int  # which of the request's samples
    tokens: list[int]  # prompt + generated, every token with KV except the last
    prompt_len: int
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 1
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: SamplerStop | None = None


class SamplingEngine:
    """Continuous batching over one frozen model."""

    batch_cache_class: type[BatchCache] = BatchCache  # a bench swaps in older bookkeeping

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Tokenizer,
        max_batch_rows: int = 64,
        prefix_cache_bytes: int = 1 << 30,
        max_context_tokens: int = 8192,
        lean_decode: bool = True,
    ) -> None:
        self.model = model.eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch_rows = max_batch_rows
        self.max_context_tokens = max_context_tokens
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._rows: list[_Row | None] = []  # per batch slot: its row, None when free
        self._batch: BatchCache | None = None  # the KV of every slot (kv.py)
        self._hf_cache: DynamicCache | None = None  # the batch's layers for HF's forward
        self._positions: list[int] = []  # next position id of each slot
        self._closed = False
        self._run_lock = threading.Lock()  # held while admitting and stepping
        self._cache_kwarg = cache_kwarg(model)  # the forward's name for its KV cache
        # The lean decode step for Llama models (None: HF's forward decodes).
        self.decoder = lean_decoder_for(model) if lean_decode else None
        self.steps = 0  # decode steps run
        self.joins = 0  # rows that joined the batch
        self.prefix_rows = 0  # of which read a shared prefix kept once for the batch
        self._copies = 0  # batch cache copies of the batches that have emptied
        self.tokens_generated = 0
        self._torch_threads = torch.get_num_threads()  # the creator's setting, for the thread
        self._thread = threading.Thread(target=self._loop, name="retool-sampler", daemon=True)
        _LIVE_ENGINES.add(self)
        self._thread.start()

    # -- public ---------------------------------------------------------------
    def submit(
        self, prompt: Sequence[int], num_samples: int, params: SamplingParams
    ) -> ConcurrentFuture[SampleResponse]:
        future: ConcurrentFuture[SampleResponse] = ConcurrentFuture()
        if self._closed:
            future.set_exception(RuntimeError("the sampling engine is closed"))
            return future
        if num_samples <= 0:
            future.set_exception(ValueError(f"num_samples must be >= 1, got {num_samples}"))
            return future
        if not prompt:
            future.set_exception(ValueError("the prompt is empty"))
            return future
        if len(prompt) + params.max_tokens > self.max_context_tokens:
            future.set_exception(
                ValueError(
                    f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                    f"max_context_tokens ({self.max_context_tokens})"
                )
            )
            return future
        self._queue.put(
            _Request(
                [int(t) for t in prompt],
                num_samples,
                params,
                future,
                [None] * num_samples,
                num_samples,
            )
        )
        return future

    def prefix_stats(self) -> PrefixStats:
        return self.prefix_cache.stats()

    def close(self) -> None:
        """Fail every request in flight or queued and stop the thread (idempotent).

        Returns once the thread has left its current step (at most
        ``_CLOSE_TIMEOUT_S``); called from the engine's own thread (a future's
        callback), it only signals.
        """
        self._closed = True
        self._queue.put(None)  # wakes an idle thread
        _LIVE_ENGINES.discard(self)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=_CLOSE_TIMEOUT_S)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stopped(self) -> bool:
        """Closed and its thread gone: nothing touches the model any more."""
        return self._closed and not self._thread.is_alive()

    # -- the loop -------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        mark_compute_thread()  # backend calls made from here (callbacks) run inline
        if torch.get_num_threads() != self._torch_threads:
            torch.set_num_threads(self._torch_threads)
        try:
            while not self._closed:
                incoming: list[_Request | None] = []
                if not self._rows:
                    incoming.append(self._queue.get())  # idle: block until work arrives
                with self._run_lock:
                    if not self._iterate(incoming):
                        return
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        """Fail the rows in flight and every request still queued."""
        error = RuntimeError("the sampling engine was closed")
        self._fail_all(error)
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            if request is not None and not request.future.done():
                request.future.set_exception(error)

    def _iterate(self, incoming: list[_Request | None]) -> bool:
        """Admit new requests, run one decode step; False once closed."""
        joining: list[tuple[list[_Row], KV]] = []
        while True:
            try:
                incoming.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for index, request in enumerate(incoming):
            if request is None or self._closed:
                error = RuntimeError("the sampling engine was closed")
                for pending in incoming[index:]:
                    if pending is not None and not pending.future.done():
                        pending.future.set_exception(error)
                return False
            try:
                group = self._admit(request)
            except Exception as exc:
                if not request.future.done():
                    request.future.set_exception(exc)
            else:
                if group is not None:
                    joining.append(group)
        if joining:
            try:
                self._join(joining)
            except Exception as exc:
                self._fail_all(exc)
                for rows, _ in joining:
                    if not rows[0].request.future.done():
                        rows[0].request.future.set_exception(exc)
        if self._closed:
            return False
        if self._rows:
            try:
                self._step()
            except Exception as exc:
                self._fail_all(exc)
        return True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the engine between steps: requests submitted meanwhile join together."""
        with self._run_lock:
            yield

    def _fail_all(self, exc: BaseException) -> None:
        for row in self._rows:
            if row is not None and not row.request.future.done():
                row.request.future.set_exception(exc)
        self._reset()

    def _reset(self) -> None:
        if self._batch is not None:
            self._copies += self._batch.copies
        self._rows, self._batch, self._hf_cache, self._positions = [], None, None, []

    @property
    def batch_copies(self) -> int:
        """How often the batch cache has been copied since the engine started."""
        return self._copies + (self._batch.copies if self._batch is not None else 0)

    # -- prefill --------------------------------------------------------------
    def _forward(self, tokens: list[int], kv: KV | None, start: int) -> tuple[torch.Tensor, KV]:
        """Logits of the last position and the KV of all ``start + len(tokens)`` tokens."""
        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(start, start + len(tokens), device=self.device).unsqueeze(0)
        cache = make_cache(kv, extra=len(tokens)) if kv is not None else make_cache_empty()
        if self.decoder is not None:  # a plain Llama: the decoder, then the head on one row
            hidden = self.model.model(
                input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache}
            ).last_hidden_state
            return self.decoder.head(hidden[0, -1:])[0].float(), cache_kv(cache)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[0, -1].float(), cache_kv(cache)

    def _admit(self, request: _Request) -> tuple[list[_Row], KV] | None:
        """Prefill ``request`` and draw its first tokens; the rows still running, with their KV."""
        prompt = request.prompt
        reused, prefix_kv = self.prefix_cache.longest_prefix(prompt, limit=len(prompt) - 1)
        logits, kv = self._forward(prompt[reused:], prefix_kv, reused)
        self.prefix_cache.put(prompt, kv)
        params = request.params
        stop_ids = frozenset(int(s) for s in params.stop if isinstance(s, int))
        stop_strings = tuple(s for s in params.stop if isinstance(s, str) and s)
        base_seed = (
            params.seed if params.seed is not None else int.from_bytes(os.urandom(6), "little")
        )
        rows = []
        for index in range(request.num_samples):
            generator = None
            if params.temperature > 0:
                generator = torch.Generator(device="cpu")
                generator.manual_seed((base_seed * _SEED_STRIDE + index) % (1 << 63))
            rows.append(
                _Row(
                    request,
                    index,
                    list(prompt),
                    len(prompt),
                    generator,
                    stop_ids,
                    stop_strings,
                    params.temperature,
                    params.top_k,
                    params.top_p,
                    params.max_tokens,
                )
            )
        # The samples share the prompt's logits: one batched draw for all of them.
        self._advance(rows, logits.unsqueeze(0).expand(len(rows), -1))
        new_rows = []
        for row in rows:
            if row.finished is None:
                new_rows.append(row)
            else:
                self._finish(row, kv)
        return (new_rows, kv) if new_rows else None

    # -- batch bookkeeping ----------------------------------------------------
    def _join(self, joining: Sequence[tuple[list[_Row], KV]] = ()) -> None:
        """Put ``joining`` (rows sharing a prompt KV) into free batch slots (kv.py)."""
        groups = [(kv, len(rows), rows[0].request.prompt) for rows, kv in joining]
        self.joins += sum(n for _, n, _ in groups)
        if self._batch is None:
            width = max(kv[0][0].shape[2] for kv, _, _ in groups)
            count = sum(n for _, n, _ in groups)
            room = count + min(count, 16)  # slots for rows joining later without a copy
            self._batch = self.batch_cache_class(
                groups[0][0],
                room,
                width,
                _LEFT,
                _SPARE,
                self._shared_prefix(groups),
                dtype=self.decoder.cache_dtype if self.decoder is not None else None,
            )
        elif self.decoder is not None and self._batch.prefix_kv is None:
            # the batch began with one prompt: look again (only the lean step reads a prefix)
            running = [row.request.prompt for row in self._rows if row is not None]
            found = self._shared_prefix(groups, running)
            if found is not None:
                self._batch.set_prefix(*found)
        for (rows, kv), slots in zip(joining, self._batch.add(groups), strict=True):
            for row, slot in zip(rows, slots, strict=True):
                while len(self._rows) <= slot:
                    self._rows.append(None)
                    self._positions.append(0)
                self._rows[slot] = row
                self._positions[slot] = kv[0][0].shape[2]
                self.prefix_rows += bool(self._batch.shared[slot])

    def _shared_prefix(
        self, groups: Sequence[tuple[KV, int, list[int]]], running: Sequence[list[int]] = ()
    ) -> tuple[list[int], KV] | None:
        """The prefix every distinct prompt joining (and ``running``) starts with, and its KV.

        Decoded once for all rows by the lean step (``decode.py``). The prompts
        of a new batch (or of a batch that has none yet and its running rows)
        are a sample of what follows: an evaluation's or a rollout's prompts
        share the system prompt and the tool rules. HF's forward cannot read a
        shared prefix, and one prompt alone says nothing about the next ones,
        so neither gets one (None). An evaluation's first request usually
        arrives alone, so a batch gets its prefix when the second prompt joins
        (``BatchCache.set_prefix``); without that look, no row of a whole
        evaluation read the prefix once (2026-12-04).
        """
        if self.decoder is None:
            return None
        prompts = {tuple(tokens) for _, _, tokens in groups} | {tuple(p) for p in running}
        if len(prompts) < 2:
            return None
        first, *others = prompts
        shortest = common = min(len(p) for p in prompts)
        for other in others:
            common = next((i for i in range(common) if first[i] != other[i]), common)
        if common < _MIN_PREFIX or common == shortest:
            # One prompt is the head of another (a turn and its continuation): its whole
            # text is no sign of what other questions share, and rows need tokens past it.
            return None
        kv = groups[0][0]
        return list(first[:common]), [(k[:, :, :common], v[:, :, :common]) for k, v in kv]

    def _compact(self) -> None:
        assert self._batch is not None
        order = self._batch.compact()
        self._rows = [self._rows[i] for i in order]
        self._positions = [self._positions[i] for i in order]

    # -- one decode step ------------------------------------------------------
    def _step(self) -> None:
        batch = self._batch
        assert batch is not None
        rows = self._rows[: batch.used]
        ids = torch.tensor(
            [row.tokens[-1] if row is not None else 0 for row in rows], device=self.device
        )
        positions = torch.tensor(self._positions[: batch.used], device=self.device)
        mask = batch.step_mask()
        # The batch cache has room for this step's column, so a step copies no history.
        if self.decoder is not None:
            logits = self.decoder.step(
                ids, positions, batch.layers, mask, batch.step_prefix()
            ).float()
        else:
            if self._hf_cache is None:
                self._hf_cache = DynamicCache()
                self._hf_cache.layers = batch.layers  # type: ignore[assignment]  # HF's layer API
            out = self.model(
                input_ids=ids.unsqueeze(1),
                position_ids=positions.unsqueeze(1),
                attention_mask=mask.long(),
                use_cache=True,
                **{self._cache_kwarg: self._hf_cache},
            )
            logits = out.logits[:, -1].float()
        batch.advance()
        self._positions = [p + 1 for p in self._positions]
        self.steps += 1
        live = [i for i, row in enumerate(rows) if row is not None]
        if len(live) != len(rows):
            logits = logits.index_select(0, torch.tensor(live, device=logits.device))
        self._advance([row for row in rows if row is not None], logits)
        finished = []
        for i in live:
            row = rows[i]
            assert row is not None
            if row.finished is not None:
                self._finish(row, batch.row_kv(i), owned=True)
                self._rows[i] = None
                finished.append(i)
        if len(finished) == len(live):
            self._reset()
            return
        if finished:
            batch.release(finished)
            del self._rows[batch.used :], self._positions[batch.used :]
            if batch.used > _COMPACT_ROWS and 2 * (len(live) - len(finished)) <= batch.used:
                self._compact()

    # -- sampling -------------------------------------------------------------
    def _advance(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample the next token of every row from its logits ``[rows, vocab]``; check stops."""
        logprobs = torch.log_softmax(logits, dim=-1)
        uniforms = [
            0.0
            if row.generator is None
            else float(torch.rand((), generator=row.generator, dtype=torch.float64))
            for row in rows
        ]
        tokens = sample_tokens(
            logits,
            logprobs,
            [row.temperature for row in rows],
            [row.top_k for row in rows],
            [row.top_p for row in rows],
            uniforms,
        )
        picked = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        self.tokens_generated += len(rows)
        for row, token, logprob in zip(rows, tokens.tolist(), picked, strict=True):
            row.generated.append(token)
            row.logprobs.append(logprob)
            row.tokens.append(token)
            if token in row.stop_ids or (row.stop_strings and self._hit_stop_string(row)):
                row.finished = SamplerStop.STOP
            elif len(row.generated) >= row.max_tokens:
                row.finished = SamplerStop.LENGTH

    def _hit_stop_string(self, row: _Row) -> bool:
        window = max(len(s) for s in row.stop_strings) + 2  # every token holds >= 1 char
        tail = self.tokenizer.decode(row.generated[-window:], skip_special_tokens=False)
        return any(s in tail for s in row.stop_strings)

    def _finish(self, row: _Row, kv: KV, owned: bool = False) -> None:
        # The KV covers every token but the last sampled one.
        self.prefix_cache.put(row.tokens[:-1], kv, owned=owned)
        request = row.request
        request.done[row.index] = SampledSequence(
            tokens=tuple(row.generated),
            logprobs=tuple(row.logprobs),
            text=self.tokenizer.decode(row.generated, skip_special_tokens=True),
            stop_reason=row.finished or SamplerStop.LENGTH,
        )
        request.remaining -= 1
        if request.remaining == 0 and not request.future.done():
            request.future.set_result(SampleResponse(tuple(s for s in request.done if s)))


def sample_tokens(
    logits: torch.Tensor,
    logprobs: torch.Tensor,
    temperatures: Sequence[float],
    top_ks: Sequence[int],
    top_ps: Sequence[float],
    uniforms: Sequence[float],
) -> torch.Tensor:
    """One token per row of ``logits`` ``[rows, vocab]`` (float32), as a long tensor.

    Temperature 0 takes the argmax. Otherwise the row's distribution is
    ``softmax(logits / temperature)``, restricted to its ``top_k`` most likely
    tokens (``-1``: all) and then to the smallest set whose mass reaches
    ``top_p``, and the token is drawn by inverse CDF with the row's uniform in
    ``[0, 1)``. ``logprobs`` is ``log_softmax(logits)``, reused at temperature 1.
    Every operation is row-wise, so a row's token never depends on the others.
    """
    count, vocab = logits.shape
    tokens = torch.empty(count, dtype=torch.long, device=logits.device)
    greedy, plain, filtered = [], [], []
    for i in range(count):
        if temperatures[i] == 0:
            greedy.append(i)
        elif 0 < top_ks[i] < vocab or top_ps[i] < 1.0:
            filtered.append(i)
        else:
            plain.append(i)

    def pick(source: torch.Tensor, index: list[int]) -> torch.Tensor:
        if len(index) == count:
            return source
        return source.index_select(0, torch.tensor(index, device=source.device))

    def put(index: list[int], values: torch.Tensor) -> None:
        if len(index) == count:
            tokens.copy_(values)
        else:
            tokens[torch.tensor(index, device=tokens.device)] = values

    def column(values: Sequence[float], index: list[int]) -> torch.Tensor:
        return torch.tensor(
            [values[i] for i in index], dtype=torch.float64, device=logits.device
        ).unsqueeze(1)

    if greedy:
        put(greedy, pick(logits, greedy).argmax(-1))
    if plain:
        temps = [temperatures[i] for i in plain]
        if all(t == 1.0 for t in temps):
            probs = pick(logprobs, plain).exp()
        else:
            scaled = pick(logits, plain) / column(temperatures, plain).to(logits.dtype)
            probs = torch.softmax(scaled, dim=-1)
        put(plain, _inverse_cdf(probs, column(uniforms, plain)))
    if filtered:
        scores = pick(logits, filtered) / column(temperatures, filtered).to(logits.dtype)
        ks = [top_ks[i] if 0 < top_ks[i] < vocab else vocab for i in filtered]
        ps = [top_ps[i] if top_ps[i] < 1.0 else float("inf") for i in filtered]
        # Each row's full normaliser (over its top-k, or over the whole vocabulary).
        norm = None
        widest = max(ks)
        if widest > _TOP_P_CANDIDATES:
            # Top-p rarely needs more than the most likely candidates: sort those only
            # when their mass already exceeds every such row's top_p (the kept set is
            # then the same as with a full sort), else sort the whole vocabulary.
            ordered, order = torch.topk(scores, _TOP_P_CANDIDATES, dim=-1)
            full = torch.logsumexp(scores, dim=-1, keepdim=True)
            mass = (ordered - full).exp().sum(-1).tolist()
            if all(k <= _TOP_P_CANDIDATES or m > p for k, m, p in zip(ks, mass, ps, strict=True)):
                norm = full
                if min(ks) <= _TOP_P_CANDIDATES:  # rows cut by top-k: normalise over their k
                    norm = norm.clone()
                    for row, k in enumerate(ks):
                        if k <= _TOP_P_CANDIDATES:
                            norm[row] = torch.logsumexp(ordered[row, :k], dim=-1)
                ks = [min(k, _TOP_P_CANDIDATES) for k in ks]
                widest = _TOP_P_CANDIDATES
        if norm is None:
            if widest < vocab:
                ordered, order = torch.topk(scores, widest, dim=-1)  # sorted, descending
            else:
                ordered, order = torch.sort(scores, dim=-1, descending=True)
        if min(ks) < widest:
            rank = torch.arange(widest, device=logits.device).unsqueeze(0)
            keep = torch.tensor(ks, device=logits.device).unsqueeze(1)
            ordered = ordered.masked_fill(rank >= keep, float("-inf"))
        if any(p < 1.0 for p in ps):
            probs = torch.softmax(ordered, dim=-1) if norm is None else (ordered - norm).exp()
            limit = torch.tensor(ps, dtype=probs.dtype, device=logits.device).unsqueeze(1)
            drop = probs.cumsum(-1) - probs > limit  # the mass before a token already suffices
            ordered = ordered.masked_fill(drop, float("-inf"))
        probs = torch.softmax(ordered, dim=-1)
        chosen = _inverse_cdf(probs, column(uniforms, filtered))
        put(filtered, order.gather(1, chosen.unsqueeze(1)).squeeze(1))
    return tokens


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative probability exceeds ``u * total``.

    Cumulated in float64; ``u * total`` is kept strictly below the total, so the
    index found always has a non-zero probability.
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)
