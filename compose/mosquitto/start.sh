#!/bin/sh
# Mosquitto's entry point in compose.yaml: writes the device password file from the
# environment (P2PFAAS_MQTT_USER, P2PFAAS_MQTT_PASSWORD) onto the data volume, then runs mosquitto.
set -eu
: "${P2PFAAS_MQTT_PASSWORD:?set P2PFAAS_MQTT_PASSWORD (see docs/containers.md)}"
user="${P2PFAAS_MQTT_USER:-device}"
passwd=/mosquitto/data/passwd
mkdir -p /mosquitto/data
umask 077
[ -f "$passwd" ] || : > "$passwd"
mosquitto_passwd -b "$passwd" "$user" "$P2PFAAS_MQTT_PASSWORD"
chown -R mosquitto:mosquitto /mosquitto/data
exec mosquitto -c /p2pfaas/mosquitto.conf
