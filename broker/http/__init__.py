"""The HTTP bridge's parts: the direct-call fast path and the routers (invoke, control, learner)
that ``broker.http_bridge.HttpBridge`` assembles, and how bridge processes are served."""
