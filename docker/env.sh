# Sourced by the Dockerfile's RUN steps. `p2pfaas image build` may put beside this file a
# CA bundle (ca.crt: pip behind a TLS-intercepting proxy) and local wheels (wheels/: the
# CPU build of torch); a plain `docker build .` has neither and uses the indexes as is.
if [ -f /opt/p2pfaas-build/ca.crt ]; then export PIP_CERT=/opt/p2pfaas-build/ca.crt; fi
if ls /opt/p2pfaas-build/wheels/*.whl >/dev/null 2>&1; then export PIP_FIND_LINKS=/opt/p2pfaas-build/wheels; fi
