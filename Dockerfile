# One image for the five services and the operator CLI: `ckpt-ha serve <service>` runs a service
# (deploy/k8s/ passes the name as the container's args), `ckpt-ha streams provision` provisions
# the streams. The `server` extra only; no secret is baked in: passwords and the signing key come
# at run time through the *_FILE settings from mounted Secrets (docs/DEPLOY.md).
#
# Build from the repository root: `docker build -t ckpt-ha:0.1.0 .`

# Wheels of ckpt-ha and every dependency, built where a compiler is at hand.
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The package, and the assets its symlinks under services/ckpt_ha/assets/ point to.
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY services ./services
COPY deploy ./deploy
COPY observability ./observability
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[server]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CKPT_HA_HOME=/var/lib/ckpt-ha \
    CKPT_HA_HTTP_HOST=0.0.0.0 \
    CKPT_HA_HTTP_PORT=8080 \
    CKPT_HA_LOG_FORMAT=json
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "ckpt-ha[server]" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 ckpt-ha \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ckpt-ha --create-home ckpt-ha
USER 10001:10001
WORKDIR /var/lib/ckpt-ha
EXPOSE 8080
ENTRYPOINT ["ckpt-ha"]
CMD ["--help"]
