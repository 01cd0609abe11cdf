# The GPU worker image: CUDA 13.0 with cuDNN, Python 3.12, torch 2.11.0+cu130, flash-attn-4,
# TransformerEngine (its PyTorch extension built here), FlashAttention 2 (a wheel built in the first
# stage: sm_90, as ../shared/gpu/FA2.md describes) and attnfuzz with Ray (the fleet extra) and
# PostgreSQL. The versions are those of the GPU campaigns (docs/gpu-campaigns.md). Used by the KubeRay
# manifests (deploy/kubernetes) and on Slurm through a container runtime (enroot/pyxis, apptainer).
#
#   docker build -f deploy/docker/worker.Dockerfile -t attnfuzz-worker .
#   docker build -f deploy/docker/worker.Dockerfile --build-arg FA2_WHEEL=wheels/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl -t attnfuzz-worker .
#       (a prebuilt FA2 wheel from the build context instead of the ~11-minute build on 16 cores)
#
# tests/fleet/test_recipes.py parses this file (dockerfile-parse) and checks its stages and pins.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04

FROM ${CUDA_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 VIRTUAL_ENV=/opt/attnfuzz
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev git procps ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/attnfuzz
ENV PATH=/opt/attnfuzz/bin:${PATH}
RUN pip install --index-url https://download.pytorch.org/whl/cu130 --extra-index-url https://pypi.org/simple \
        torch==2.11.0 \
    && pip install ninja packaging wheel setuptools

# FlashAttention 2: the index has it as an sdist only; built for sm_90, dropout and ALiBi off (paths
# attnfuzz never calls), its stale copy of flash_attn/cute removed so it cannot shadow flash-attn-4's
FROM base AS fa2
ARG FA2_VERSION=2.8.3.post2
ARG FA2_WHEEL=
COPY . /src
RUN mkdir -p /wheels \
    && if [ -n "${FA2_WHEEL}" ]; then cp "/src/${FA2_WHEEL}" /wheels/; else \
        pip download --no-deps --no-binary :all: flash-attn==${FA2_VERSION} -d /tmp/fa2 \
        && mkdir /tmp/fa2/src && tar xzf /tmp/fa2/flash_attn-*.tar.gz -C /tmp/fa2/src --strip-components=1 \
        && cd /tmp/fa2/src \
        && sed -i 's|# "-DFLASHATTENTION_DISABLE_DROPOUT",|"-DFLASHATTENTION_DISABLE_DROPOUT",|; s|# "-DFLASHATTENTION_DISABLE_ALIBI",|"-DFLASHATTENTION_DISABLE_ALIBI",|' setup.py \
        && FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 MAX_JOBS=16 NVCC_THREADS=2 python setup.py bdist_wheel \
        && cd dist && mkdir out && for w in *.whl; do \
            python -m zipfile -e "$w" x && rm -rf x/flash_attn/cute \
            && sed -i '/^flash_attn\/cute\//d' x/flash_attn-*.dist-info/RECORD \
            && (cd x && python -m zipfile -c "../out/$w" .) && rm -rf x; done \
        && cp out/*.whl /wheels/; fi

FROM base AS worker
# TransformerEngine's PyTorch extension compiles against this torch (no build isolation)
RUN pip install nvidia-cutlass-dsl==4.8.1 flash-attn-4==4.0.0b36 \
    && NVTE_FRAMEWORK=pytorch pip install --no-build-isolation "transformer-engine[pytorch]==2.20.2"
COPY --from=fa2 /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
COPY . /opt/attnfuzz-src
RUN pip install "/opt/attnfuzz-src[fleet,postgres]" \
    && useradd --create-home --uid 1000 attnfuzz \
    && mkdir -p /cache && chown attnfuzz /cache
USER attnfuzz
WORKDIR /home/attnfuzz
ENV ATTNFUZZ_JIT_CACHE_DIR=/cache/fa4-jit ATTNFUZZ_SPOOL_DIR=/cache/spool
# what runs here and what does not (KubeRay and Slurm start 'ray start' instead)
CMD ["attnfuzz", "backends"]
