"""How a node runs its workers: OS processes (``process``, the default), containers (``docker``: one per worker); in-process workers need no module here."""
