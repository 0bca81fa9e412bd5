# The load balancer in front of `make serve-replicas`' replicas: nginx, as a Kubernetes Service spreads a Deployment's
# pods. Built on the serving image's base, so it needs no image registry either.
ARG BASE=python:3.11-slim
FROM ${BASE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY nginx.conf /etc/nginx/nginx.conf
EXPOSE 8080
ENTRYPOINT ["nginx", "-g", "daemon off;"]
