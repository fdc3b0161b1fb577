"""The prefill and decode worker daemons and what they share (their messages to and from the
conductor are typed in daemons.serving.messages)."""
