"""LLM engines behind verl's client interface: `await client.generate(request_id, prompt_ids=...,
sampling_params=...) -> TokenOutput`, which is what `AgentLoopWorker` calls (verl's
`LLMServerClient.generate`). Token ids in, token ids out, for both engines:

* `TransformersEngine` (CPU or one GPU, no server): transformers `generate`, batching the
  requests of concurrent trajectories into one forward pass. Greedy when `temperature` is 0
  (verl's validation default); honours `max_tokens`, `stop` strings and the model's EOS tokens;
  returns per-token log-probs when `logprobs` is set. It is both `verl-search eval`'s engine and
  the generation inside the CPU training rollout (`verl_search.cpu.transformers_rollout`), which loads
  the trainer's weights into it every step (`load_weights`) and, under verl's asynchronous trainers,
  aborts the running turns before a weight update and resumes after it (`abort`, `resume`).
* `SGLangEngine` (GPU): an SGLang server the user starts
  (`python -m sglang.launch_server --model-path MODEL --port 30000`), called at its native
  `POST /generate` with `input_ids`, answering `output_ids`. Not exercised here (no GPU).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from verl.workers.rollout.replica import TokenOutput

from verl_search.llm.models import end_of_sequence_ids
from verl_search.agent_protocol.tokens import cut_at_first_stop

logger = logging.getLogger(__name__)

#: seconds the engine waits for a step's requests to arrive before it starts a batch that is not full:
#: trajectories reach their next turn a few milliseconds apart (tokenising, a retrieval call), and a
#: batch started at the first one runs it alone while the others wait a whole batch for the next
GATHER_WINDOW_S = 0.05


ABORTED = "aborted"
"""`TokenOutput.stop_reason` of a turn cut by `TransformersEngine.abort` (verl's vLLM server's word, which
verl's `FullyAsyncLLMServerClient` resumes)."""


@dataclass
class _Request:
    prompt_ids: list[int]
    params: dict
    future: asyncio.Future = field(default=None)


class _AbortCriteria:
    """transformers stopping criterion: stop every row once `flag` is set; counts the steps of the batch."""

    def __init__(self, flag: threading.Event):
        self.flag = flag
        self.steps = 0

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.steps += 1
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


def eos_token_ids(model, tokenizer) -> set[int]:
    """Token ids that end a turn: the generation config's EOS, the tokenizer's
    (`models.end_of_sequence_ids`), and `<|im_end|>`."""
    configured = getattr(model, "generation_config", None)
    ids = {int(token) for token in end_of_sequence_ids(tokenizer, generation_config=configured)}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids


class TransformersEngine:
    """A transformers causal LM as a verl LLM client, batching concurrent requests.

    Requests that arrive while a batch runs wait for the next one; before a batch that is not
    full, the engine waits up to `GATHER_WINDOW_S` (0.05 s) for more. Each batch is one padded
    `model.generate` call (left padding, KV cache) run in a worker thread, so the event loop
    keeps serving the agent loops and the retrieval calls meanwhile.

    Args:
        model: a loaded `PreTrainedModel` (eval mode is set here).
        tokenizer: its tokenizer.
        max_batch_size: most requests in one forward batch (default 8).

    Partial rollout (verl's asynchronous trainers): `abort()` stops the running batch after its current
    token and answers its unfinished requests with the tokens so far and `stop_reason` `ABORTED`, answers
    queued ones the same way with no tokens, and holds new requests until `resume()` (or answers them
    `ABORTED` at once with `reject=True`), as verl's vLLM server does (`vllm_async_server.py`,
    `abort_all_requests`). Every output's `extra_fields["weight_version"]` is the number of `load_weights`
    calls before its batch started: the weights that generated its tokens.

    Attributes:
        batches, requests: counters of `generate` batches run and requests answered.
        weight_version: `load_weights` calls so far.
        batch_steps: tokens generated so far by the running batch (0 when idle).
    """

    def __init__(self, model, tokenizer, max_batch_size: int = 8):
        import torch

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self._torch = torch
        self._aborted_in_batch = 0
        self._model_lock = threading.Lock()  # a weight update never lands in the middle of a batch
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self._aborting = threading.Event()  # read by the running batch's stopping criterion
        self._open: asyncio.Event | None = None  # cleared between `abort` and `resume`: new requests wait
        self._reject = False
        self._criteria: _AbortCriteria | None = None
        self.batches = 0
        self.requests = 0
        self.weight_version = 0

    @property
    def batch_steps(self) -> int:
        criteria = self._criteria
        return criteria.steps if criteria is not None else 0

    def _gate(self) -> asyncio.Event:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs) -> TokenOutput:
        """Generate one turn for one trajectory (the signature of verl's `LLMServerClient.generate`)."""
        gate = self._gate()
        if not gate.is_set():
            if self._reject:
                return self._aborted_output([], None)
            await gate.wait()
        request = _Request(list(prompt_ids), dict(sampling_params), asyncio.get_running_loop().create_future())
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await request.future

    async def abort(self, reject: bool = False) -> int:
        """Stop generating until `resume()`; returns once no batch runs. Unfinished requests are answered
        with their tokens so far and `stop_reason` `ABORTED`; returns how many (running and queued)."""
        self._gate().clear()
        self._reject = reject
        queued, self._pending = self._pending, []
        for request in queued:
            request.future.set_result(self._aborted_output([], [] if request.params.get("logprobs") else None))
        self._aborting.set()
        while self._worker is not None and not self._worker.done():
            await asyncio.sleep(0.005)
        self._aborting.clear()
        aborted = len(queued) + self._aborted_in_batch
        self._aborted_in_batch = 0
        logger.info("aborted %d request(s) (%d queued); generation paused until resume", aborted, len(queued))
        return aborted

    def resume(self) -> None:
        """Admit requests again after `abort()`."""
        self._reject = False
        self._gate().set()

    def _aborted_output(self, ids: list[int], log_probs: list[float] | None) -> TokenOutput:
        return TokenOutput(token_ids=ids, log_probs=log_probs, num_preempted=0, stop_reason=ABORTED,
                           extra_fields={"weight_version": self.weight_version})

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            deadline = loop.time() + GATHER_WINDOW_S  # let the other trajectories of this step queue theirs
            while len(self._pending) < self.max_batch_size and loop.time() < deadline:
                await asyncio.sleep(0.005)
            batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size:]
            if not batch:  # `abort` answered them during the gather window
                continue
            try:
                version, outputs = await asyncio.to_thread(self._generate_batch, batch)
            except Exception as exc:  # fail these requests, keep serving
                for request in batch:
                    request.future.set_exception(exc)
                continue
            for request, (ids, log_probs, finished) in zip(batch, outputs):
                self._aborted_in_batch += not finished
                request.future.set_result(TokenOutput(token_ids=ids, log_probs=log_probs, num_preempted=0,
                                                      stop_reason="completed" if finished else ABORTED,
                                                      extra_fields={"weight_version": version}))

    def load_weights(self, named_tensors) -> int:
        """Copy `(name, tensor)` pairs into the model (blocking; waits for a running batch).

        Names are the model's `state_dict` keys (what verl's `get_per_tensor_param` yields).
        Returns the number of tensors loaded. Raises `KeyError` naming parameters the model
        does not have (a different architecture), `ValueError` on a shape mismatch.
        """
        torch = self._torch
        params = self.model.state_dict()
        loaded = 0
        with self._model_lock, torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise KeyError(f"weight {name!r} is not a parameter of the rollout model "
                                   f"({type(self.model).__name__}); trainer and rollout models differ")
                target = params[name]
                if target.shape != tensor.shape:
                    raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} from the trainer, "
                                     f"{tuple(target.shape)} in the rollout model")
                target.copy_(tensor.to(dtype=target.dtype, device=target.device))
                loaded += 1
            self.weight_version += 1
        return loaded

    def _generate_batch(self, batch: list[_Request]) -> tuple[int, list[tuple[list[int], list[float] | None, bool]]]:
        """The weight version the batch ran with, and per request: its token ids, their log-probs (None
        unless asked), and whether the turn finished (False: cut by `abort`)."""
        with self._model_lock:
            if self._aborting.is_set():  # an abort came while the batch waited for the lock
                return self.weight_version, [([], [] if r.params.get("logprobs") else None, False) for r in batch]
            self._criteria = _AbortCriteria(self._aborting)
            try:
                return self.weight_version, self._generate_batch_locked(batch, self._criteria)
            finally:
                self._criteria = None

    def _generate_batch_locked(self, batch: list[_Request], criteria: _AbortCriteria):
        torch = self._torch
        params = batch[0].params
        max_new = max(int(r.params.get("max_tokens") or 512) for r in batch)
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            attention[row, width - len(request.prompt_ids):] = 1
        temperature = float(params.get("temperature") or 0.0)
        sampling = {"do_sample": False}
        if temperature > 0:
            top_k = int(params.get("top_k") or -1)
            sampling = {"do_sample": True, "temperature": temperature, "top_p": float(params.get("top_p") or 1.0),
                        "top_k": top_k if top_k > 0 else None}
        stops = sorted({s for r in batch for s in r.params.get("stop") or []})
        want_log_probs = any(r.params.get("logprobs") for r in batch)
        started = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new, eos_token_id=sorted(self.eos_ids),
                pad_token_id=self.pad_id, stop_strings=stops or None, tokenizer=self.tokenizer if stops else None,
                return_dict_in_generate=True, output_logits=want_log_probs, stopping_criteria=[criteria],
                **sampling,
            )
        sequences = output.sequences
        self.batches += 1
        self.requests += len(batch)
        logger.info("generated a batch of %d (prompt width %d, up to %d new tokens, %d generated) in %.1f s",
                    len(batch), width, max_new, sequences.shape[1] - width, time.perf_counter() - started)
        aborted = self._aborting.is_set()
        results = []
        for row, request in enumerate(batch):
            ids = self._trim(sequences[row, width:].tolist(), request)
            log_probs = None
            if request.params.get("logprobs"):
                log_probs = self._token_log_probs(output.logits, row, ids, temperature)
            results.append((ids, log_probs, not aborted or self._finished(ids, request)))
        return results

    def _token_log_probs(self, step_logits, row: int, ids: list[int], temperature: float) -> list[float]:
        """log p(token) of each generated token, from the raw logits divided by `temperature`
        (1 when greedy), as verl's actor computes them."""
        torch = self._torch
        scale = temperature if temperature > 0 else 1.0
        return [float(torch.log_softmax(step_logits[step][row].float() / scale, dim=-1)[token])
                for step, token in enumerate(ids)]

    def _trim(self, ids: list[int], request: _Request) -> list[int]:
        """This request's tokens: up to its first EOS (kept), stop string, or `max_tokens`."""
        for position, token in enumerate(ids):
            if token in self.eos_ids:
                ids = ids[: position + 1]
                break
        stops = request.params.get("stop")
        if stops:
            ids = cut_at_first_stop(ids, lambda t: self.tokenizer.decode(t, skip_special_tokens=False), stops)
        return ids[: int(request.params.get("max_tokens") or len(ids))]

    def _finished(self, ids: list[int], request: _Request) -> bool:
        """Whether a turn `_trim` returned ended on its own (EOS, a stop string, `max_tokens`) rather than where
        an abort stopped its batch; asked of aborted batches only (one more decode per request)."""
        if len(ids) >= int(request.params.get("max_tokens") or len(ids)) or (ids and ids[-1] in self.eos_ids):
            return True
        stops = request.params.get("stop") or []
        text = self.tokenizer.decode(ids, skip_special_tokens=False) if stops else ""
        return any(stop in text for stop in stops)


class SGLangEngine:
    """An SGLang server as a verl LLM client (native `/generate`, token ids in and out).

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:30000`.
        timeout: seconds per request (default 600).
    """

    def __init__(self, url: str, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs) -> TokenOutput:
        """Generate one turn; raises `RuntimeError` naming the server's answer on an HTTP error."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        params = {"max_new_tokens": sampling_params.get("max_tokens"), "stop": sampling_params.get("stop"),
                  "temperature": sampling_params.get("temperature", 0.0), "top_p": sampling_params.get("top_p", 1.0),
                  "top_k": sampling_params.get("top_k", -1)}
        body = {"input_ids": list(prompt_ids), "sampling_params": {k: v for k, v in params.items() if v is not None}}
        async with self._session.post(f"{self.url}/generate", json=body) as response:
            payload = await response.json(content_type=None)
            if response.status != 200:
                raise RuntimeError(f"SGLang server at {self.url} answered HTTP {response.status}: {str(payload)[:300]}")
        if "output_ids" not in payload:
            raise RuntimeError(f"SGLang server at {self.url} returned no output_ids (keys: {sorted(payload)}); "
                               "use an SGLang version whose /generate returns token ids")
        return TokenOutput(token_ids=list(payload["output_ids"]), num_preempted=0)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
