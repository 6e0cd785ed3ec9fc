{
  "targets": [
    {
      "target_name": "pdctl_native",
      "sources": ["src/addon.cc", "src/pool.cc", "src/crc32c.cc", "src/cuda.cc", "src/transfer.cc", "src/ucx.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-O2"],
      "libraries": ["-lrt", "-ldl", "-pthread"],
      "conditions": [
        ["'<!(test -f /usr/include/ucp/api/ucp.h && echo 1 || echo 0)'=='1'", {
          "defines": ["PDCTL_HAVE_UCX"]
        }],
        ["'<!(node -p \"process.env.PDCTL_SANITIZE || 0\")'=='1'", {
          "cflags_cc": ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-O1", "-g"],
          "ldflags": ["-fsanitize=address,undefined"]
        }]
      ]
    },
    {
      "target_name": "pdctl_fake_cudart",
      "type": "shared_library",
      "sources": ["test/fake-cudart.cc"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-O2"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "libraries": ["-lrt", "-pthread"]
    }
  ]
}
