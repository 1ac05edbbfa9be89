# One image for every p2pfaas role (node, bridges, controller, learner).
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# torch first; pass --build-arg TORCH_PIP_ARGS="--index-url <your CPU wheel index>"
# to get the small CPU build instead of the default one
ARG TORCH_PIP_ARGS=""
RUN pip install "torch==2.13.0" $TORCH_PIP_ARGS
COPY pyproject.toml README.md mosquitto.conf nats.conf ./
COPY broker broker
COPY nodes nodes
COPY controller controller
COPY functions functions
COPY p2pfaas p2pfaas
RUN pip install .
ENTRYPOINT ["p2pfaas"]
