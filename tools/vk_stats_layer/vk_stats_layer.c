// A Vulkan layer that reports what the driver made of each compute pipeline: where the device has
// VK_KHR_pipeline_executable_properties (NVIDIA's does), the layer enables it, asks every compute pipeline for its
// statistics (register count, binary size, shared memory, ...) and prints them to stderr as the pipeline is created,
// after the module's index. Register counts decide how many workgroups an SM holds (docs/benchmarks.md, occupancy);
// binary size / 16 is the instruction count of a 16-byte-instruction ISA. With KVVIZ_SPIRV_DIR set it also writes
// each SPIR-V module wgpu (naga) hands the driver, as moduleNNNN.spv (spirv-dis reads it), and each pipeline's
// internal representations where the driver gives any.
//
//   cd tools/vk_stats_layer && gcc -O1 -shared -fPIC -fvisibility=hidden -o libvk_stats_layer.so vk_stats_layer.c
//   (the Vulkan headers: apt-get install libvulkan-dev; the library stays beside the manifest, git-ignored)
//   VK_ADD_LAYER_PATH=$PWD/tools/vk_stats_layer VK_INSTANCE_LAYERS=VK_LAYER_KVVIZ_stats python3 tools/fma_forms.py
#include <vulkan/vulkan.h>
#include <vulkan/vk_layer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
static PFN_vkGetInstanceProcAddr next_gipa;
static PFN_vkGetDeviceProcAddr next_gdpa;
static PFN_vkCreateShaderModule next_csm;
static PFN_vkCreateComputePipelines next_ccp;
static PFN_vkGetPipelineExecutablePropertiesKHR gpep;
static PFN_vkGetPipelineExecutableStatisticsKHR gpes;
static PFN_vkGetPipelineExecutableInternalRepresentationsKHR gpeir;
static int have_pep;
static int counter;
static struct { uint64_t mod; int idx; } mods[4096];
static int nmods;

static const char *dir(void) { const char *d = getenv("KVVIZ_SPIRV_DIR"); return d ? d : "/tmp"; }

static VkResult VKAPI_CALL hk_CreateInstance(const VkInstanceCreateInfo *ci, const VkAllocationCallbacks *a, VkInstance *inst) {
  VkLayerInstanceCreateInfo *li = (VkLayerInstanceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
    li = (VkLayerInstanceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  next_gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateInstance create = (PFN_vkCreateInstance)next_gipa(VK_NULL_HANDLE, "vkCreateInstance");
  return create(ci, a, inst);
}

static VkInstance g_inst;
static VkResult VKAPI_CALL hk_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *ci, const VkAllocationCallbacks *a, VkDevice *dev) {
  VkLayerDeviceCreateInfo *li = (VkLayerDeviceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
    li = (VkLayerDeviceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  next_gdpa = li->u.pLayerInfo->pfnNextGetDeviceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(VK_NULL_HANDLE, "vkCreateDevice");
  PFN_vkEnumerateDeviceExtensionProperties enumx = (PFN_vkEnumerateDeviceExtensionProperties)gipa(g_inst, "vkEnumerateDeviceExtensionProperties");
  have_pep = 0;
  if (enumx) {
    uint32_t n = 0; enumx(pd, NULL, &n, NULL);
    VkExtensionProperties *p = calloc(n, sizeof *p); enumx(pd, NULL, &n, p);
    for (uint32_t i = 0; i < n; i++) if (!strcmp(p[i].extensionName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) have_pep = 1;
    free(p);
  }
  VkDeviceCreateInfo c2 = *ci;
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR feat = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, (void *)ci->pNext, VK_TRUE};
  const char **ext = calloc(ci->enabledExtensionCount + 1, sizeof *ext);
  int already = 0;
  for (uint32_t i = 0; i < ci->enabledExtensionCount; i++) { ext[i] = ci->ppEnabledExtensionNames[i]; if (!strcmp(ext[i], VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) already = 1; }
  if (have_pep) {
    c2.pNext = &feat;
    if (!already) ext[c2.enabledExtensionCount++] = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    c2.ppEnabledExtensionNames = ext;
  }
  VkResult r = create(pd, &c2, a, dev);
  if (r != VK_SUCCESS && have_pep) { have_pep = 0; r = create(pd, ci, a, dev); }
  fprintf(stderr, "[vk-stats] device created (pipeline executable properties: %d) -> %d\n", have_pep, r);
  free(ext);
  next_csm = (PFN_vkCreateShaderModule)next_gdpa(*dev, "vkCreateShaderModule");
  next_ccp = (PFN_vkCreateComputePipelines)next_gdpa(*dev, "vkCreateComputePipelines");
  if (have_pep) {
    gpep = (PFN_vkGetPipelineExecutablePropertiesKHR)next_gdpa(*dev, "vkGetPipelineExecutablePropertiesKHR");
    gpes = (PFN_vkGetPipelineExecutableStatisticsKHR)next_gdpa(*dev, "vkGetPipelineExecutableStatisticsKHR");
    gpeir = (PFN_vkGetPipelineExecutableInternalRepresentationsKHR)next_gdpa(*dev, "vkGetPipelineExecutableInternalRepresentationsKHR");
  }
  return r;
}

static VkResult VKAPI_CALL hk_CreateShaderModule(VkDevice d, const VkShaderModuleCreateInfo *ci, const VkAllocationCallbacks *a, VkShaderModule *m) {
  VkResult r = next_csm(d, ci, a, m);
  int idx = __sync_fetch_and_add(&counter, 1);
  if (getenv("KVVIZ_SPIRV_DIR")) {
    char path[1024]; snprintf(path, sizeof path, "%s/module%04d.spv", dir(), idx);
    FILE *f = fopen(path, "wb"); if (f) { fwrite(ci->pCode, 1, ci->codeSize, f); fclose(f); }
  }
  if (r == VK_SUCCESS && nmods < 4096) { mods[nmods].mod = (uint64_t)*m; mods[nmods].idx = idx; nmods++; }
  return r;
}

static int module_index(VkShaderModule m) {
  for (int i = nmods - 1; i >= 0; i--) if (mods[i].mod == (uint64_t)m) return mods[i].idx;
  return -1;
}

static VkResult VKAPI_CALL hk_CreateComputePipelines(VkDevice d, VkPipelineCache pc, uint32_t n, const VkComputePipelineCreateInfo *ci, const VkAllocationCallbacks *a, VkPipeline *p) {
  VkComputePipelineCreateInfo *c2 = calloc(n, sizeof *c2);
  for (uint32_t i = 0; i < n; i++) { c2[i] = ci[i]; if (have_pep) c2[i].flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR | VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR; }
  VkResult r = next_ccp(d, pc, n, c2, a, p);
  if (r == VK_SUCCESS && have_pep) {
    for (uint32_t i = 0; i < n; i++) {
      int idx = module_index(ci[i].stage.module);
      FILE *f = stderr; fprintf(f, "[vk-stats] pipeline of module %d\n", idx);
      VkPipelineInfoKHR pi = {VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, NULL, p[i]};
      uint32_t ne = 0; gpep(d, &pi, &ne, NULL);
      VkPipelineExecutablePropertiesKHR *ep = calloc(ne, sizeof *ep);
      for (uint32_t e = 0; e < ne; e++) ep[e].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR;
      gpep(d, &pi, &ne, ep);
      for (uint32_t e = 0; e < ne; e++) {
        fprintf(f, "executable %u: %s: %s (subgroup %u)\n", e, ep[e].name, ep[e].description, ep[e].subgroupSize);
        VkPipelineExecutableInfoKHR ei = {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, NULL, p[i], e};
        uint32_t ns = 0; gpes(d, &ei, &ns, NULL);
        VkPipelineExecutableStatisticKHR *st = calloc(ns, sizeof *st);
        for (uint32_t s = 0; s < ns; s++) st[s].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR;
        gpes(d, &ei, &ns, st);
        for (uint32_t s = 0; s < ns; s++) {
          fprintf(f, "  %s = ", st[s].name);
          switch (st[s].format) {
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: fprintf(f, "%u", st[s].value.b32); break;
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: fprintf(f, "%lld", (long long)st[s].value.i64); break;
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: fprintf(f, "%llu", (unsigned long long)st[s].value.u64); break;
            default: fprintf(f, "%g", st[s].value.f64);
          }
          fprintf(f, "   (%s)\n", st[s].description);
        }
        free(st);
        uint32_t nr = 0; gpeir(d, &ei, &nr, NULL);
        VkPipelineExecutableInternalRepresentationKHR *ir = calloc(nr, sizeof *ir);
        for (uint32_t k = 0; k < nr; k++) ir[k].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR;
        gpeir(d, &ei, &nr, ir);
        for (uint32_t k = 0; k < nr; k++) { ir[k].pData = calloc(1, ir[k].dataSize + 1); }
        gpeir(d, &ei, &nr, ir);
        for (uint32_t k = 0; k < nr; k++) {
          fprintf(f, "  == internal representation %u: %s: %s (%s, %zu bytes)\n", k, ir[k].name, ir[k].description, ir[k].isText ? "text" : "binary", ir[k].dataSize);
          if (getenv("KVVIZ_SPIRV_DIR")) {
            char p2[1024]; snprintf(p2, sizeof p2, "%s/module%04d.e%u.ir%u.%s", dir(), idx, e, k, ir[k].isText ? "txt" : "bin");
            FILE *g = fopen(p2, "wb"); if (g) { fwrite(ir[k].pData, 1, ir[k].isText && ir[k].dataSize ? strnlen(ir[k].pData, ir[k].dataSize) : ir[k].dataSize, g); fclose(g); }
          }
          free(ir[k].pData);
        }
        free(ir);
      }
      free(ep);
    }
  }
  free(c2);
  return r;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkstats_GetDeviceProcAddr(VkDevice d, const char *name);
EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkstats_GetInstanceProcAddr(VkInstance inst, const char *name) {
  if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)vkstats_GetInstanceProcAddr;
  if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkstats_GetDeviceProcAddr;
  if (!strcmp(name, "vkCreateInstance")) return (PFN_vkVoidFunction)hk_CreateInstance;
  if (!strcmp(name, "vkCreateDevice")) { if (inst) g_inst = inst; return (PFN_vkVoidFunction)hk_CreateDevice; }
  if (!strcmp(name, "vkCreateShaderModule")) return (PFN_vkVoidFunction)hk_CreateShaderModule;
  if (!strcmp(name, "vkCreateComputePipelines")) return (PFN_vkVoidFunction)hk_CreateComputePipelines;
  if (inst) g_inst = inst;
  return next_gipa ? next_gipa(inst, name) : NULL;
}
EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkstats_GetDeviceProcAddr(VkDevice d, const char *name) {
  if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkstats_GetDeviceProcAddr;
  if (!strcmp(name, "vkCreateShaderModule")) return (PFN_vkVoidFunction)hk_CreateShaderModule;
  if (!strcmp(name, "vkCreateComputePipelines")) return (PFN_vkVoidFunction)hk_CreateComputePipelines;
  return next_gdpa(d, name);
}
