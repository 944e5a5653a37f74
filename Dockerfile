# One image for the five services and the operator CLI: `ckpt-ha serve <service>` runs a service
# (deploy/k8s/ passes the name as the container's args), `ckpt-ha streams provision` provisions
# the streams. ckpt-ha with the `server` extra and nothing else: no bundled nats-server or Redis
# (the `lab` extra), no compiler, no pip. No secret is baked in: passwords and the signing key
# come at run time through the *_FILE settings from mounted Secrets (docs/DEPLOY.md).
#
# Build with `scripts/build-image` (docs/DEPLOY.md#the-image): it stages the wheels under
# build/image/wheels/ (the dependencies exactly as deploy/image/requirements.lock pins them, by
# hash; the ckpt-ha wheel built from this checkout) and runs `docker build` or `podman build`.
# Nothing is downloaded inside the build: pip installs from the staged wheels only.

# Debian bookworm, pinned by digest. BASE selects another, e.g. one built from Debian's archive
# with mmdebstrap where no registry is reachable (`scripts/build-image --local-base`).
ARG BASE=debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

# Debian's python3 (a base that has it already is left as it is).
FROM ${BASE} AS python
RUN command -v python3 >/dev/null \
    || { apt-get update \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
         && rm -rf /var/lib/apt/lists/*; }

# The virtual environment /opt/ckpt-ha, and its SBOM. pip runs from its wheel and is not
# installed; neither is the SBOM generator (its own environment, left in this stage).
FROM python AS build
ENV PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
COPY build/image/wheels/deps /wheels/deps
RUN python3 -m venv --without-pip /opt/ckpt-ha \
    && pip=$(echo /wheels/deps/pip-*.whl)/pip \
    && /opt/ckpt-ha/bin/python "$pip" install --no-deps --require-hashes \
         --find-links /wheels/deps --requirement /wheels/deps/requirements.lock
COPY build/image/wheels/app /wheels/app
RUN pip=$(echo /wheels/deps/pip-*.whl)/pip \
    && /opt/ckpt-ha/bin/python "$pip" install --find-links /wheels/app --find-links /wheels/deps "ckpt-ha[server]" \
    && /opt/ckpt-ha/bin/python "$pip" check \
    && /opt/ckpt-ha/bin/python "$pip" uninstall -q -y pip \
    && /opt/ckpt-ha/bin/python -m compileall -q /opt/ckpt-ha/lib
COPY build/image/wheels/sbom /wheels/sbom
RUN python3 -m venv --without-pip /opt/sbom-tool \
    && pip=$(echo /wheels/deps/pip-*.whl)/pip \
    && /opt/sbom-tool/bin/python "$pip" install --no-deps --require-hashes \
         --find-links /wheels/sbom --requirement /wheels/sbom/requirements.lock \
    && mkdir -p /opt/ckpt-ha/share/sbom \
    && /opt/sbom-tool/bin/cyclonedx-py environment --output-reproducible --of JSON \
         -o /opt/ckpt-ha/share/sbom/ckpt-ha.cdx.json /opt/ckpt-ha/bin/python

FROM python
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
ARG BASE
LABEL org.opencontainers.image.title="ckpt-ha" \
      org.opencontainers.image.description="Services and operator CLI that make ML-training checkpoints recoverable" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}" \
      io.ckpt-ha.sbom="/opt/ckpt-ha/share/sbom/ckpt-ha.cdx.json"
ENV PATH=/opt/ckpt-ha/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CKPT_HA_HOME=/var/lib/ckpt-ha \
    CKPT_HA_HTTP_HOST=0.0.0.0 \
    CKPT_HA_HTTP_PORT=8080 \
    CKPT_HA_LOG_FORMAT=json
COPY --from=build /opt/ckpt-ha /opt/ckpt-ha
RUN groupadd --system --gid 10001 ckpt-ha \
    && useradd --system --uid 10001 --gid 10001 --no-log-init --home-dir /var/lib/ckpt-ha \
         --create-home --shell /usr/sbin/nologin ckpt-ha
USER 10001:10001
WORKDIR /var/lib/ckpt-ha
EXPOSE 8080
ENTRYPOINT ["ckpt-ha"]
CMD ["--help"]
