# hermes-kernel gateway: python:3.11-slim, an unprivileged user, the SQLite data in a volume.
#
#   docker build -t hermes-kernel .
#   docker run -d --name hermes-kernel -p 127.0.0.1:8080:8080 --env-file /etc/hermes-kernel/hermes-kernel.env \
#       -v hermes-data:/var/lib/hermes-kernel hermes-kernel
#
# Secrets come from the environment only (--env-file); none is baked into the image. The image
# holds the three environment configurations (/etc/hermes-kernel/{dev,staging,prod}.yaml) and runs
# prod.yaml; pass another command to pick another one. See docs/deploy.md.

FROM python:3.11-slim AS build
# the extras installed: feishu; deploy/compose/ adds temporal (engine: temporal, docs/scale-out.md)
ARG EXTRAS=feishu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY src ./src
RUN python -m venv /opt/hermes-kernel \
    && /opt/hermes-kernel/bin/pip install --constraint constraints.txt ".[${EXTRAS}]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="hermes-kernel" \
      org.opencontainers.image.description="A small Hermes-style agent gateway: webhook and Feishu channels"
ENV PATH=/opt/hermes-kernel/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HERMES_LOG_LEVEL=INFO
RUN groupadd --system --gid 10001 hermes \
    && useradd --system --uid 10001 --gid hermes --home-dir /var/lib/hermes-kernel --shell /usr/sbin/nologin hermes \
    && mkdir -p /var/lib/hermes-kernel \
    && chown hermes:hermes /var/lib/hermes-kernel
COPY --from=build /opt/hermes-kernel /opt/hermes-kernel
COPY deploy/config/ /etc/hermes-kernel/
COPY deploy/skills/ /etc/hermes-kernel/skills/
WORKDIR /var/lib/hermes-kernel
USER 10001:10001
VOLUME ["/var/lib/hermes-kernel"]
EXPOSE 8080
# /healthz answers 200 while the gateway accepts messages, 503 while it stops; no curl needed.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["hermes-kernel", "--config", "/etc/hermes-kernel/prod.yaml", "serve", "--host", "0.0.0.0"]
