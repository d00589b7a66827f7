# Sources of the verbs (RoCEv2) transport, added to tensorlane_sidecar_core.
set(TENSORLANE_VERBS_SOURCES
  src/transport/verbs/device.cpp
  src/transport/verbs/gdr_flush.cpp
  src/transport/verbs/mr_cache.cpp
  src/transport/verbs/qp.cpp
  src/transport/verbs/recv_session.cpp
  src/transport/verbs/recv_window.cpp
  src/transport/verbs/registrar.cpp
  src/transport/verbs/send_session.cpp
  src/transport/verbs/verbs_transport.cpp
  src/transport/verbs/wc_status.cpp
  src/transport/verbs/wire.cpp
)
