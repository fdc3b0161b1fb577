"""Chunked pipeline-parallel prefill (CPP): a group of stage processes linked by the transfer engine."""
