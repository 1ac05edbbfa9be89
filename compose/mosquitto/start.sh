#!/bin/sh
# Mosquitto's entry point in compose.yaml: writes the password files from the environment
# (compose/secrets/mosquitto.env, made by `p2pfaas compose init`): the devices' (listener 1883,
# P2PFAAS_MQTT_DEVICE_<i>=name:password) and the MQTT bridge's (listener 1884), then runs mosquitto.
set -eu
: "${P2PFAAS_MQTT_BRIDGE_PASSWORD:?run p2pfaas compose init first (docs/containers.md)}"
mkdir -p /mosquitto/data
umask 077
devices=/mosquitto/data/passwd
bridge=/mosquitto/data/passwd-bridge
: > "$devices"
: > "$bridge"
env | sed -n 's/^P2PFAAS_MQTT_DEVICE_[0-9]*=//p' | while IFS=: read -r user password; do
  mosquitto_passwd -b "$devices" "$user" "$password"
done
mosquitto_passwd -b "$bridge" "$P2PFAAS_MQTT_BRIDGE_USER" "$P2PFAAS_MQTT_BRIDGE_PASSWORD"
chown -R mosquitto:mosquitto /mosquitto/data
exec mosquitto -c /p2pfaas/mosquitto.conf
