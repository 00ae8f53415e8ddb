# One image with every entry point: muster, muster-server, muster-agent, muster-k8s-adapter,
# muster-slurm-adapter. deploy/kubernetes and deploy/helm use it.
#   docker build -t ghcr.io/muster-sched/muster:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY muster muster
COPY server server
COPY clients clients
COPY adapters adapters
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# The non-root user the manifests run as (runAsUser 65532).
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin muster \
    && mkdir -p /var/lib/muster && chown muster:muster /var/lib/muster
USER 65532:65532
EXPOSE 50051
ENTRYPOINT []
# Secure by default: off loopback the server speaks mutual TLS, from a Secret mounted at
# /etc/muster/tls (tls.crt, tls.key, ca.crt: docs/security.md); without it the server refuses to
# start and names the missing file. Plaintext needs an explicit --insecure in the run command.
CMD ["muster-server", "--listen", "0.0.0.0:50051", "--state", "/var/lib/muster/muster.db", \
     "--tls-cert", "/etc/muster/tls/tls.crt", "--tls-key", "/etc/muster/tls/tls.key", \
     "--tls-client-ca", "/etc/muster/tls/ca.crt"]
