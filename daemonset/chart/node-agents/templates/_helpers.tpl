{{/*
Names and labels follow daemonset/ (kustomize), so that a release and `kubectl apply -k`
make the same objects: node-agent, with -dra and/or -<family> for a DRA or one-family
agent (the overlays' nameSuffix), and app.kubernetes.io/instance only on those.
*/}}

{{/* Bad values fail the render with the reason, before any object is made. */}}
{{- define "node-agents.validate" -}}
{{- $families := .Values.families -}}
{{- if or (not $families) (gt (len $families) 2) (ne (len $families) (len (uniq $families))) -}}
{{- fail (printf "families: one or both of gpu and roce, each once; got %v" $families) -}}
{{- end -}}
{{- range $families -}}
{{- if not (has . (list "gpu" "roce")) -}}
{{- fail (printf "families: %q is not a family; gpu or roce" .) -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.api (list "device-plugin" "dra")) -}}
{{- fail (printf "api: %q; device-plugin or dra" .Values.api) -}}
{{- end -}}
{{- if and .Values.mps.enabled (not (has "gpu" $families)) -}}
{{- fail "mps.enabled: MPS shares GPUs; families has no gpu" -}}
{{- end -}}
{{- $_ := include "node-agents.flagValues" . -}}
{{- $_ = include "node-agents.defaultConfig" . -}}
{{- end -}}

{{/* "-dra", "-gpu", "-dra-roce", or "" for the base (every family, device plugins). */}}
{{- define "node-agents.suffix" -}}
{{- $parts := list -}}
{{- if eq .Values.api "dra" -}}{{- $parts = append $parts "dra" -}}{{- end -}}
{{- if eq (len .Values.families) 1 -}}{{- $parts = append $parts (first .Values.families) -}}{{- end -}}
{{- if $parts -}}-{{ join "-" $parts }}{{- end -}}
{{- end -}}

{{- define "node-agents.fullname" -}}
node-agent{{ include "node-agents.suffix" . }}
{{- end -}}

{{/* The DaemonSet's selector, and its pods' labels. */}}
{{- define "node-agents.selectorLabels" -}}
app.kubernetes.io/name: node-agent
{{- if include "node-agents.suffix" . }}
app.kubernetes.io/instance: {{ include "node-agents.fullname" . }}
{{- end }}
{{- end -}}

{{/* Every object's labels but the Namespace's and the DeviceClasses'. */}}
{{- define "node-agents.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: node-agents
{{- if include "node-agents.suffix" . }}
app.kubernetes.io/instance: {{ include "node-agents.fullname" . }}
{{- end }}
{{- end -}}

{{- define "node-agents.hasFamily" -}}
{{- if has .family .root.Values.families }}true{{ end -}}
{{- end -}}

{{/*
The named configs, as a dict: config.map, or the shipped default as "default", with
migStrategy and the other top-level flags written into each.
*/}}
{{- define "node-agents.configData" -}}
{{- $data := dict -}}
{{- if .Values.config.map -}}
{{- $data = deepCopy .Values.config.map -}}
{{- else if eq .Values.api "dra" -}}
{{- $_ := set $data "default" (.Files.Get "files/config-dra.yaml") -}}
{{- else -}}
{{- $_ := set $data "default" (.Files.Get "files/config.yaml") -}}
{{- end -}}
{{- range $name, $text := $data -}}
{{- $config := fromYaml $text -}}
{{- if or (hasKey $config "Error") (not (kindIs "map" $config)) -}}
{{- fail (printf "config.map.%s is not YAML of a config file (version: v1 ...): %s" $name (get $config "Error" | default "not a mapping")) -}}
{{- end -}}
{{- end -}}
{{- $flags := include "node-agents.flagValues" . | fromJson -}}
{{- if $flags -}}
{{- range $name, $text := deepCopy $data -}}
{{- $config := fromYaml $text -}}
{{- $section := get $config "flags" | default dict -}}
{{- $plugin := get $section "plugin" | default dict -}}
{{- range $key, $value := $flags -}}
{{- $_ := set $section $key $value -}}
{{- if hasKey $plugin $key -}}{{- $_ := set $plugin $key $value -}}{{- end -}}
{{- end -}}
{{- $_ := set $config "flags" $section -}}
{{- $_ := set $data $name (toYaml $config) -}}
{{- end -}}
{{- end -}}
{{- toJson $data -}}
{{- end -}}

{{/* The top-level flags that are set, as a JSON object; fails where they cannot apply. */}}
{{- define "node-agents.flagValues" -}}
{{- $flags := dict -}}
{{- range $key := list "migStrategy" "failOnInitError" "deviceListStrategy" "deviceIDStrategy" -}}
{{- /* Helm drops a key whose value is null, so an unset flag is an absent key. */ -}}
{{- if and (hasKey $.Values $key) (not (kindIs "invalid" (index $.Values $key))) -}}
{{- $value := index $.Values $key -}}
{{- if $.Values.config.name -}}
{{- fail (printf "%s: not with config.name; set flags.%s in ConfigMap %s" $key $key $.Values.config.name) -}}
{{- end -}}
{{- if and (eq $.Values.api "dra") (ne $key "failOnInitError") -}}
{{- fail (printf "%s: has no effect with api: dra (claims choose devices)" $key) -}}
{{- end -}}
{{- $_ := set $flags $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $flags -}}
{{- end -}}

{{/* The named config the agent reads. */}}
{{- define "node-agents.defaultConfig" -}}
{{- $chosen := .Values.config.default -}}
{{- if .Values.config.name -}}
{{- if .Values.config.map -}}
{{- fail "config: set name (an existing ConfigMap) or map (configs in values), not both" -}}
{{- end -}}
{{- default "default" $chosen -}}
{{- else -}}
{{- $names := include "node-agents.configData" . | fromJson | keys | sortAlpha -}}
{{- if not $chosen -}}
{{- if has "default" $names -}}{{- $chosen = "default" -}}
{{- else if eq (len $names) 1 -}}{{- $chosen = first $names -}}
{{- else -}}
{{- fail (printf "config.default: name the config to read, one of %s" (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- if not (has $chosen $names) -}}
{{- fail (printf "config.default: %q is not in config.map (%s)" $chosen (join ", " $names)) -}}
{{- end -}}
{{- $chosen -}}
{{- end -}}
{{- end -}}

{{/*
The ConfigMap's name: config.name, or, as kustomize's configMapGenerator names it, the
generator's name and a hash of the content (kustomize's: the first 10 hex digits of the
SHA-256 of {"data":...,"kind":"ConfigMap","name":""} as JSON, 0 1 3 a e written g h k m
t). A change of config renames it, and so rolls the DaemonSet as `kubectl apply -k` does.
*/}}
{{- define "node-agents.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else -}}
{{- $data := include "node-agents.configData" . | fromJson -}}
{{- $hash := dict "data" $data "kind" "ConfigMap" "name" "" | toJson | sha256sum | trunc 10 -}}
{{- $hash = $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" -}}
node-agent-config{{ include "node-agents.suffix" . }}-{{ $hash }}
{{- end -}}
{{- end -}}

{{- define "node-agents.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The required node affinity: the nodes of the release's families, each term with the API
label (NotIn [dra] for device plugins, In [dra] for DRA).
*/}}
{{- define "node-agents.nodeAffinity" -}}
{{- $labels := list "feature.node.kubernetes.io/pci-10de.present" "nvidia.com/gpu.present" "node-agents.io/gpu-node" -}}
{{- if not (has "gpu" .Values.families) -}}
{{- $labels = list "feature.node.kubernetes.io/rdma.capable" "feature.node.kubernetes.io/pci-15b3.present" "node-agents.io/rdma-node" -}}
{{- end -}}
{{- $operator := ternary "In" "NotIn" (eq .Values.api "dra") -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- range $labels }}
      - matchExpressions:
          - key: {{ . }}
            operator: In
            values: ["true"]
          - key: node-agents.io/api
            operator: {{ $operator }}
            values: ["dra"]
      {{- end }}
{{- end -}}

{{/* "true" where a node's label chooses its config (NVIDIA's config manager does this):
an existing ConfigMap (config.name) or several named configs in config.map. */}}
{{- define "node-agents.perNodeConfig" -}}
{{- if or .Values.config.name (gt (len (include "node-agents.configData" . | fromJson)) 1) -}}true{{- end -}}
{{- end -}}
