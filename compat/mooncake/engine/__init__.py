"""``mooncake.engine``: the transfer engine vLLM's MooncakeConnector and SGLang's P/D path import."""

from mooncake.engine.transfer_engine import TransferEngine

__all__ = ["TransferEngine"]
