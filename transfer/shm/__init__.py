"""Same-host transport over named shared-memory regions."""
