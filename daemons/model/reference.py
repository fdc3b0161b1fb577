"""Greedy generation in one process without a KV cache: the ground truth for every other path."""

from __future__ import annotations

from daemons.model.llama import LlamaModel


def generate_reference(model: LlamaModel, prompt_tokens: list[int], max_tokens: int) -> list[int]:
    """The greedy continuation of ``prompt_tokens``: at most ``max_tokens``, ending with the first
    stop token (EOS or another of ``stop_token_ids``) if one comes.

    Every step recomputes the whole sequence densely; slow, but it shares nothing with the paged
    cache, the block tables or the batcher that it checks.
    """
    if not prompt_tokens:
        raise ValueError("prompt_tokens must not be empty")
    tokens, generated = list(prompt_tokens), []
    while len(generated) < max_tokens:
        token = int(model.forward_dense(tokens)[-1].argmax())
        tokens.append(token)
        generated.append(token)
        if token in model.config.stop_token_ids:
            break
    return generated
