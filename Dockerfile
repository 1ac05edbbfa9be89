# p2pfaas images, built from this repository (docs/containers.md):
#   node (default): every role — node (scheduler, discovery, learner with torch), bridges, controller
#   worker:         `python -m nodes.worker` only (nats-py, pydantic, orjson, docker): a small,
#                   fast-starting image for `--runtime docker` worker pools
#   docker build -t p2pfaas .                      docker build --target worker -t p2pfaas-worker .
#   p2pfaas image build [--target worker|node] [--base IMAGE]   (the same, with local wheels/CA)
# BASE must have python3 (3.11+) with venv; tests use a local Debian bookworm image instead.
ARG BASE=python:3.11-slim

# the sources, once, for both images
FROM scratch AS sources
COPY pyproject.toml README.md mosquitto.conf nats.conf /app/
COPY broker /app/broker
COPY nodes /app/nodes
COPY controller /app/controller
COPY functions /app/functions
COPY p2pfaas /app/p2pfaas

FROM ${BASE} AS runtime
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
COPY docker/env.sh docker/worker-requirements.txt docker/ca.cr[t] /opt/p2pfaas-build/
RUN python3 -m venv /opt/venv \
 && useradd --system --uid 10001 --home-dir /data --no-create-home p2pfaas \
 && mkdir -p /data && chown p2pfaas /data
WORKDIR /app

FROM runtime AS worker
RUN . /opt/p2pfaas-build/env.sh && pip install -r /opt/p2pfaas-build/worker-requirements.txt
COPY --from=sources /app /app
RUN . /opt/p2pfaas-build/env.sh && pip install --no-deps . && rm -rf build *.egg-info
USER p2pfaas
CMD ["python", "-m", "nodes.worker"]

FROM runtime AS node
# torch's CPU build: a local wheel from the build context (p2pfaas image build), else this index
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY docker/wheels/ /opt/p2pfaas-build/wheels/
RUN . /opt/p2pfaas-build/env.sh \
 && if ls /opt/p2pfaas-build/wheels/torch-*.whl >/dev/null 2>&1; \
    then pip install /opt/p2pfaas-build/wheels/torch-*.whl; \
    else pip install "torch==2.13.0" --index-url "$TORCH_INDEX_URL"; fi \
 && rm -rf /opt/p2pfaas-build/wheels
# the other dependencies before the sources: a source change rebuilds only the last layers
COPY pyproject.toml ./
RUN . /opt/p2pfaas-build/env.sh \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=sources /app /app
RUN . /opt/p2pfaas-build/env.sh && pip install --no-deps . && rm -rf build *.egg-info
USER p2pfaas
ENV P2PFAAS_DATA_DIR=/data
VOLUME /data
ENTRYPOINT ["p2pfaas"]
CMD ["--help"]
