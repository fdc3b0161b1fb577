"""Errors of the model library (codes -1090..-1099, the model's slice of the daemons range)."""

from __future__ import annotations

from transfer.errors import MooncakeError


class KVCacheFull(MooncakeError):
    """Not enough free KV pages for what a sequence needs; the caller queues or rejects it."""

    code, name = -1090, "KV_CACHE_FULL"

    def __init__(self, needed: int, free: int) -> None:
        self.needed, self.free = needed, free
        super().__init__(f"KV cache full: {needed} pages needed, {free} free")


class CheckpointError(MooncakeError):
    """A model directory that is missing files, names another architecture or lacks weights."""

    code, name = -1091, "CHECKPOINT_ERROR"


class ChatTemplateError(MooncakeError):
    """A conversation that cannot become a prompt: the checkpoint has no chat template, or its
    template refused the messages (``raise_exception``); the caller's request is at fault."""

    code, name = -1092, "CHAT_TEMPLATE_ERROR"


class DeviceUnavailable(MooncakeError):
    """The model_device setting names a device this host does not have (cuda without CUDA)."""

    code, name = -1093, "DEVICE_UNAVAILABLE"
