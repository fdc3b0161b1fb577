"""Memory on a GPU: viewing device buffers and staging them where GPUDirect is absent."""
