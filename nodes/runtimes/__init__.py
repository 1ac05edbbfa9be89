"""Worker runtimes beside the built-in process and in-process ones (``docker``: one container per worker)."""
